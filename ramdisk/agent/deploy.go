package agent

import (
	"context"
	"fmt"
	"log/slog"

	v1 "github.com/machina-metal/machina/api/v1"
)

// DeployConfig configures Deploy.
type DeployConfig struct {
	// Write configures the verified image write.
	Write WriteConfig
	// Seed is rendered into the NoCloud seed partition.
	Seed   v1.Seed
	Logger *slog.Logger
}

// DeployResult is a finished deploy.
type DeployResult struct {
	WriteResult
	// SeedOffset is the byte offset of the seed partition.
	SeedOffset int64
}

// Deploy validates and renders the seed and lays out its FAT16 filesystem
// (NewFAT16, before touching the disk: a seed that does not fit fails with
// nothing written), writes the verified image (WriteImage), then adds the
// NoCloud seed partition at the end of the disk (AddSeedPartition's
// placement) and fsyncs. The seed partition's range is zeroed through the
// device's Zeroer where it has one (BLKZEROOUT on a block device, fallocate
// punch-hole on a file; see [File]) and only the filesystem's non-zero
// extents are written (FAT16.WriteExtents), 3.5 KiB of its 8 MiB for a
// typical seed; the disk then holds exactly MakeFAT16's bytes there.
func Deploy(ctx context.Context, dev BlockDevice, diskSize int64, cfg DeployConfig) (DeployResult, error) {
	var res DeployResult
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	files, err := RenderSeed(cfg.Seed)
	if err != nil {
		return res, fmt.Errorf("deploy: %w", err)
	}
	if cfg.Write.SizeBytes+SeedSizeBytes+(2<<20) > diskSize {
		return res, fmt.Errorf("deploy: %w: image %d + seed %d bytes exceed disk %d", ErrNoRoomForSeed, cfg.Write.SizeBytes, SeedSizeBytes, diskSize)
	}
	// The hidden sectors (the partition's start) are set once it is known.
	seed, err := NewFAT16(SeedSizeBytes, SeedLabel, 0, files)
	if err != nil {
		return res, fmt.Errorf("deploy: %w", err)
	}
	if cfg.Write.Logger == nil {
		cfg.Write.Logger = cfg.Logger
	}
	wr, err := WriteImage(ctx, dev, diskSize, cfg.Write)
	res.WriteResult = wr
	if err != nil {
		return res, fmt.Errorf("deploy: %w", err)
	}
	var zeroedBy string
	var written int64
	off, err := addSeed(dev, diskSize, cfg.Write.SizeBytes, seed.SizeBytes, cfg.Seed.InstanceID, func(start int64) (err error) {
		seed.SetHiddenSectors(uint32(start / 512))
		zeroedBy, written, err = seed.WriteExtents(dev, start)
		return err
	})
	if err != nil {
		return res, fmt.Errorf("deploy: %w", err)
	}
	if err := dev.Sync(); err != nil {
		return res, fmt.Errorf("deploy: fsync: %w", err)
	}
	log.Info("seed written", "offset", off, "sizeBytes", seed.SizeBytes, "bytesWritten", written, "zeroedBy", zeroedBy)
	res.SeedOffset = off
	return res, nil
}
