package qmp

import (
	"context"
	"errors"
	"fmt"
)

// SystemPowerdown presses the ACPI power button (system_powerdown). The
// guest decides whether to shut down; qemu emits POWERDOWN at once and
// SHUTDOWN when the guest powers off.
func (c *Client) SystemPowerdown(ctx context.Context) error {
	return c.Execute(ctx, "system_powerdown", nil, nil)
}

// SystemReset resets the machine like the reset line (system_reset); qemu
// emits RESET with reason "host-qmp-system-reset".
func (c *Client) SystemReset(ctx context.Context) error {
	return c.Execute(ctx, "system_reset", nil, nil)
}

// Stop pauses all vCPUs (stop; event STOP). The process keeps running.
func (c *Client) Stop(ctx context.Context) error { return c.Execute(ctx, "stop", nil, nil) }

// Cont resumes vCPUs after Stop or after a start with -S (cont; event RESUME).
func (c *Client) Cont(ctx context.Context) error { return c.Execute(ctx, "cont", nil, nil) }

// Quit makes qemu exit at once, like pulling the plug (quit). qemu may close
// the socket before its reply arrives; that counts as success. It returns
// once the connection has closed or ctx ends.
func (c *Client) Quit(ctx context.Context) error {
	err := c.Execute(ctx, "quit", nil, nil)
	if err != nil && !errors.Is(err, ErrClosed) {
		return err
	}
	select {
	case <-c.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("qmp: quit: wait for close: %w", ctx.Err())
	}
}

// Status is the reply of query-status. Status is qemu's RunState, e.g.
// "prelaunch" (started with -S), "running", "paused", "shutdown",
// "guest-panicked", "internal-error".
type Status struct {
	Running    bool   `json:"running"`
	Singlestep bool   `json:"singlestep"`
	Status     string `json:"status"`
}

// QueryStatus returns the VM run state (query-status).
func (c *Client) QueryStatus(ctx context.Context) (Status, error) {
	var s Status
	err := c.Execute(ctx, "query-status", nil, &s)
	return s, err
}

// BlockInserted describes the medium in a block device (query-block
// "inserted"). File is the image path or URL; Drv is the format driver.
type BlockInserted struct {
	File     string `json:"file"`
	Drv      string `json:"drv"`
	RO       bool   `json:"ro"`
	NodeName string `json:"node-name"`
}

// BlockInfo is one entry of query-block. Device is the legacy drive id
// (-drive id=), QDev the device id or QOM path (-device id=). Inserted is
// nil when no medium is present. TrayOpen is meaningful only when
// Removable is true.
type BlockInfo struct {
	Device    string         `json:"device"`
	QDev      string         `json:"qdev"`
	Removable bool           `json:"removable"`
	Locked    bool           `json:"locked"`
	TrayOpen  bool           `json:"tray_open"`
	Inserted  *BlockInserted `json:"inserted"`
}

// QueryBlock lists the block devices (query-block).
func (c *Client) QueryBlock(ctx context.Context) ([]BlockInfo, error) {
	var b []BlockInfo
	err := c.Execute(ctx, "query-block", nil, &b)
	return b, err
}

// ChangeMedium inserts filename (a local path, or an http(s):// URL served
// with Range support, via qemu's curl driver) into the removable device
// with qdev id (e.g. an ide-cd -device id=cdrom0), opening and closing the
// tray as needed (blockdev-change-medium). format is the image format, e.g.
// "raw"; readOnly selects read-only-mode "read-only" instead of "retain".
// A missing device answers *Error with Class "GenericError" or
// "DeviceNotFound" depending on the qemu version.
func (c *Client) ChangeMedium(ctx context.Context, id, filename, format string, readOnly bool) error {
	args := map[string]any{"id": id, "filename": filename}
	if format != "" {
		args["format"] = format
	}
	if readOnly {
		args["read-only-mode"] = "read-only"
	}
	return c.Execute(ctx, "blockdev-change-medium", args, nil)
}

// Eject removes the medium from the removable device with qdev id
// (eject with "id"). force ejects even if the guest locked the tray.
func (c *Client) Eject(ctx context.Context, id string, force bool) error {
	return c.Execute(ctx, "eject", map[string]any{"id": id, "force": force}, nil)
}
