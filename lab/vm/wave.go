package vm

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/machina-metal/machina/lab/vm/osimage"
)

// WaveMemoryMiB is the guest memory of the amd64 lab VMs. The ramdisk
// agent shares image pieces with its deploy wave only when the image fits
// in a quarter of MemTotal (it holds every verified piece in memory to
// serve it, beside the write's own buffer: ramdisk/agent usePieces), so
// the guest gets four times the lab OS image (osimage.SizeBytes) plus
// 256 MiB for what MemTotal leaves out (the kernel's reserved memory) and
// the ramdisk's own files. qemu allocates guest memory as the guest
// touches it: a VM that only commissions costs far less than this.
const WaveMemoryMiB = 4*(osimage.SizeBytes>>20) + 256

var (
	waveJoined  = regexp.MustCompile(`msg="deploy wave joined".*?\bmachine=(\S+) wave=(\S+)`)
	metricValue = func(body, name string) (float64, error) {
		m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + ` (\S+)$`).FindStringSubmatch(body)
		if m == nil {
			return 0, fmt.Errorf("/metrics lacks %s", name)
		}
		return strconv.ParseFloat(m[1], 64)
	}
)

// waveShared checks the deploy of the machines in deployed as one wave
// that shared the image's pieces: the controller planned every one of
// them into the same wave (its "deploy wave joined" log lines), the
// agents' reports add up to one image each with bytes from peers and less
// than len(deployed) images from the controller
// (machina_image_bytes_served_total), no peer served a bad piece, and the
// controller accepted each machine's written and read-back digest as the
// image's sha256 (its deploy outcome event). It returns a summary for the
// step's name.
func (l *lab) waveShared(ctx context.Context, deployed []string, img, sum string) (string, error) {
	fi, err := os.Stat(img)
	if err != nil {
		return "", fmt.Errorf("vm lab: wave: %w", err)
	}
	size := float64(fi.Size())
	logb, err := os.ReadFile(filepath.Join(l.dir, "controller.log"))
	if err != nil {
		return "", fmt.Errorf("vm lab: wave: %w", err)
	}
	waves := map[string]string{}
	for _, m := range waveJoined.FindAllStringSubmatch(string(logb), -1) {
		waves[m[1]] = m[2]
	}
	var ids []string
	for _, name := range deployed {
		id, ok := waves[name]
		if !ok {
			return "", fmt.Errorf("vm lab: wave: the controller planned %s into no deploy wave (no piece manifest or no piece listener announced; see controller.log)", name)
		}
		if !slices.Contains(ids, id) {
			ids = append(ids, id)
		}
	}
	if len(ids) != 1 {
		return "", fmt.Errorf("vm lab: wave: %s were planned into waves %s, want one", strings.Join(deployed, ", "), strings.Join(ids, ", "))
	}

	req, err := http.NewRequestWithContext(ctx, http.MethodGet, l.adminBase+"/metrics", nil)
	if err != nil {
		return "", err
	}
	req.Header.Set("Authorization", "Bearer "+l.token)
	resp, err := l.hc.Do(req)
	if err != nil {
		return "", fmt.Errorf("vm lab: wave: get /metrics: %w", err)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("vm lab: wave: get /metrics: %d %v", resp.StatusCode, err)
	}
	peer, err := metricValue(string(body), `machina_image_bytes_served_total{source="peer"}`)
	if err != nil {
		return "", fmt.Errorf("vm lab: wave: %w", err)
	}
	ctrl, err := metricValue(string(body), `machina_image_bytes_served_total{source="controller"}`)
	if err != nil {
		return "", fmt.Errorf("vm lab: wave: %w", err)
	}
	bad, err := metricValue(string(body), "machina_image_bad_pieces_total")
	if err != nil {
		return "", fmt.Errorf("vm lab: wave: %w", err)
	}
	n := float64(len(deployed))
	switch {
	case ctrl+peer != n*size:
		return "", fmt.Errorf("vm lab: wave: agents reported %.0f bytes from the controller and %.0f from peers, want %d images of %.0f bytes in all", ctrl, peer, len(deployed), size)
	case peer <= 0 || ctrl >= n*size:
		return "", fmt.Errorf("vm lab: wave: agents reported %.0f bytes from the controller and %.0f from peers: the wave shared nothing", ctrl, peer)
	case bad != 0:
		return "", fmt.Errorf("vm lab: wave: %.0f bad pieces reported by honest peers", bad)
	}

	for _, name := range deployed {
		ok := false
		for after := uint64(0); ; {
			evs, err := l.api.ServerEvents(ctx, name, after, 200)
			if err != nil {
				return "", fmt.Errorf("vm lab: wave: events of %s: %w", name, err)
			}
			for _, ev := range evs.Events {
				// The controller writes this only when the agent's digest
				// and read-back digest both equal the plan's (api checkDone).
				if ev.To == "deployed" && strings.Contains(ev.Message, "sha256 "+sum+", read back") {
					ok = true
				}
			}
			if evs.Next == 0 || ok {
				break
			}
			after = evs.Next
		}
		if !ok {
			return "", fmt.Errorf("vm lab: wave: %s has no deploy outcome with the image's sha256 %s read back", name, sum)
		}
	}
	return fmt.Sprintf("; one wave %s: agents fetched %.2f images from the controller and %.2f from peers for %d machines, no bad piece, every read-back digest matched",
		ids[0], ctrl/size, peer/size, len(deployed)), nil
}
