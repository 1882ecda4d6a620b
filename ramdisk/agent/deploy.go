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

// Deploy validates and renders the seed (before touching the disk), writes
// the verified image (WriteImage), then adds the NoCloud seed partition at
// the end of the disk (AddSeedPartition) and fsyncs.
func Deploy(ctx context.Context, dev BlockDevice, diskSize int64, cfg DeployConfig) (DeployResult, error) {
	var res DeployResult
	files, err := RenderSeed(cfg.Seed)
	if err != nil {
		return res, fmt.Errorf("deploy: %w", err)
	}
	if cfg.Write.SizeBytes+SeedSizeBytes+(2<<20) > diskSize {
		return res, fmt.Errorf("deploy: %w: image %d + seed %d bytes exceed disk %d", ErrNoRoomForSeed, cfg.Write.SizeBytes, SeedSizeBytes, diskSize)
	}
	if cfg.Write.Logger == nil {
		cfg.Write.Logger = cfg.Logger
	}
	wr, err := WriteImage(ctx, dev, diskSize, cfg.Write)
	res.WriteResult = wr
	if err != nil {
		return res, fmt.Errorf("deploy: %w", err)
	}
	// hidden sectors are fixed up below once the offset is known; build twice
	// is cheap (8 MiB) and keeps MakeFAT16 pure.
	start := seedStartGuess(diskSize)
	fsImg, err := MakeFAT16(SeedSizeBytes, SeedLabel, uint32(start/512), files)
	if err != nil {
		return res, fmt.Errorf("deploy: %w", err)
	}
	off, err := AddSeedPartition(dev, diskSize, cfg.Write.SizeBytes, fsImg, cfg.Seed.InstanceID)
	if err != nil {
		return res, fmt.Errorf("deploy: %w", err)
	}
	if off != start {
		if fsImg, err = MakeFAT16(SeedSizeBytes, SeedLabel, uint32(off/512), files); err != nil {
			return res, fmt.Errorf("deploy: %w", err)
		}
		if _, err := dev.WriteAt(fsImg, off); err != nil {
			return res, fmt.Errorf("deploy: rewrite seed: %w", err)
		}
	}
	if err := dev.Sync(); err != nil {
		return res, fmt.Errorf("deploy: fsync: %w", err)
	}
	res.SeedOffset = off
	return res, nil
}

// seedStartGuess is where AddSeedPartition puts the seed on a GPT disk with
// 128 entries of 128 bytes (the common case).
func seedStartGuess(diskSize int64) int64 {
	const mib = 1 << 20
	return (diskSize - 512 - 128*128 - SeedSizeBytes) / mib * mib
}
