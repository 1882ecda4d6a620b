package bmcsim

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"time"
)

// powerTransition is a power change in progress (Config.PowerTransition):
// from the state read before the Reset to "On" or "Off", until until.
type powerTransition struct {
	from, to string
	until    time.Time
}

// resetTarget is the power state ResetType rt leads to from before, or ""
// for a reset that does not change power (Nmi).
func resetTarget(before, rt string) string {
	switch rt {
	case "On", "ForceOn", "ForceRestart", "GracefulRestart", "PowerCycle":
		return "On"
	case "ForceOff", "GracefulShutdown":
		return "Off"
	case "PushPowerButton":
		if before == "On" || before == "PoweringOn" {
			return "Off"
		}
		return "On"
	}
	return ""
}

// startTransition records the power change of an accepted Reset when
// Config.PowerTransition is set; before is the PowerState read before it.
func (s *Server) startTransition(before, rt string) {
	if s.cfg.PowerTransition <= 0 {
		return
	}
	to := resetTarget(before, rt)
	if to == "" {
		return
	}
	s.transMu.Lock()
	s.trans = powerTransition{from: before, to: to, until: s.now().Add(s.cfg.PowerTransition)}
	s.transMu.Unlock()
}

// powerState is the ComputerSystem PowerState the BMC reports: the
// backend's, or during a power change (Config.PowerTransition) while the
// backend reads the change's target, "PoweringOn"/"PoweringOff", or the
// state before it with Config.PowerTransitionKeepsState.
func (s *Server) powerState(ctx context.Context) (string, error) {
	ps, err := s.power.PowerState(ctx)
	if err != nil || s.cfg.PowerTransition <= 0 {
		return ps, err
	}
	s.transMu.Lock()
	t := s.trans
	s.transMu.Unlock()
	if t.to == "" || !s.now().Before(t.until) || ps != t.to {
		// Done, or the host changed power on its own since (a ramdisk
		// that powered itself off): the BMC reports what it reads.
		return ps, nil
	}
	switch {
	case s.cfg.PowerTransitionKeepsState && t.from != "":
		return t.from, nil
	case t.to == "On":
		return "PoweringOn", nil
	}
	return "PoweringOff", nil
}

// fetchMedia reads the first 2 KiB of image (a Range request; a server
// without Range support answers 200 and the body is cut) when
// Config.FetchMedia is set. It returns 0 when the image is readable (or
// fetching is off), else the status of the Redfish error it wrote.
func (s *Server) fetchMedia(ctx context.Context, w http.ResponseWriter, image string) int {
	if !s.cfg.FetchMedia {
		return 0
	}
	hc := s.cfg.MediaClient
	if hc == nil {
		hc = &http.Client{Timeout: 30 * time.Second}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, image, nil)
	if err != nil {
		return writeError(w, http.StatusBadRequest, "Base.1.8.PropertyValueFormatError", "The value "+image+" for the parameter Image is of a different format than the parameter can accept.", image, "Image")
	}
	req.Header.Set("Range", "bytes=0-2047")
	resp, err := hc.Do(req)
	if err != nil {
		s.log.Debug("bmcsim: virtual media fetch failed", "image", image, "err", err)
		var ne net.Error
		why := "connection failed"
		if errors.As(err, &ne) && ne.Timeout() {
			why = "timed out"
		}
		return writeError(w, http.StatusBadRequest, "Base.1.8.CouldNotEstablishConnection", "An attempt to access the resource "+image+" failed due to a connection issue ("+why+").", image)
	}
	defer resp.Body.Close()
	_, _ = io.CopyN(io.Discard, resp.Body, 2048)
	switch {
	case resp.StatusCode == http.StatusOK || resp.StatusCode == http.StatusPartialContent:
		return 0
	case resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden:
		return writeError(w, http.StatusBadRequest, "Base.1.8.ResourceAtUriUnauthorized", "While accessing the resource at "+image+", the service received an authorization error "+resp.Status+".", image, resp.Status)
	}
	return writeError(w, http.StatusBadRequest, "Base.1.8.CouldNotEstablishConnection", "An attempt to access the resource "+image+" failed due to a connection issue (HTTP "+resp.Status+").", image)
}
