// Package qmp is a small client for the QEMU Machine Protocol over a unix
// socket (qemu -qmp unix:PATH,server=on,wait=off), as used by the VM lab to
// drive power, reset and virtual media of qemu VMs.
//
// Protocol: docs/interop/qmp-spec.rst in the qemu tree. The server sends a
// greeting {"QMP":{...}}; the client must send qmp_capabilities before any
// other command; each command {"execute":..,"arguments":..,"id":..} is
// answered by {"return":..,"id":..} or {"error":{"class","desc"},"id":..};
// asynchronous {"event":..} messages may arrive at any time.
//
// The package imports no other project package.
package qmp

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// ErrClosed is returned by commands issued after the connection closed
// (qemu exited, Close was called, or the socket failed).
var ErrClosed = errors.New("qmp: connection closed")

// Error is a QMP error reply ({"error":{"class":..,"desc":..}}).
// Class is one of qemu's ErrorClass names, e.g. "GenericError",
// "CommandNotFound", "DeviceNotFound".
type Error struct {
	Command string
	Class   string
	Desc    string
}

func (e *Error) Error() string {
	return fmt.Sprintf("qmp: %s: %s: %s", e.Command, e.Class, e.Desc)
}

// Event is an asynchronous QMP event such as SHUTDOWN, RESET, STOP, RESUME,
// POWERDOWN or DEVICE_TRAY_MOVED. Data is the raw "data" member.
type Event struct {
	Name      string
	Data      json.RawMessage
	Seconds   int64
	Microsecs int64
}

// Client is one QMP session. Commands may be issued from several
// goroutines; replies are matched by id. Safe for concurrent use.
type Client struct {
	conn   net.Conn
	wmu    sync.Mutex
	mu     sync.Mutex
	nextID uint64
	wait   map[uint64]chan reply
	closed bool
	err    error
	done   chan struct{}
	events chan Event
	// Greeting is qemu's version block from the greeting, e.g.
	// {"qemu":{"major":7,"minor":2,"micro":22},"package":"..."}.
	Greeting json.RawMessage
}

type reply struct {
	Return json.RawMessage `json:"return"`
	Error  *struct {
		Class string `json:"class"`
		Desc  string `json:"desc"`
	} `json:"error"`
	ID    *uint64         `json:"id"`
	Event string          `json:"event"`
	Data  json.RawMessage `json:"data"`
	QMP   *struct {
		Version json.RawMessage `json:"version"`
	} `json:"QMP"`
	Timestamp *struct {
		Seconds      int64 `json:"seconds"`
		Microseconds int64 `json:"microseconds"`
	} `json:"timestamp"`
}

// EventBuffer is how many events Events buffers; further events are
// dropped until the reader catches up.
const EventBuffer = 256

// Dial connects to the QMP unix socket at path, reads the greeting and
// negotiates capabilities (qmp_capabilities). ctx bounds the whole
// handshake; afterwards it has no effect on the connection.
func Dial(ctx context.Context, path string) (*Client, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, fmt.Errorf("qmp: dial %s: %w", path, err)
	}
	c, err := NewClient(ctx, conn)
	if err != nil {
		conn.Close()
		return nil, err
	}
	return c, nil
}

// NewClient runs the QMP handshake on an established connection and takes
// ownership of it.
func NewClient(ctx context.Context, conn net.Conn) (*Client, error) {
	c := &Client{
		conn:   conn,
		wait:   map[uint64]chan reply{},
		done:   make(chan struct{}),
		events: make(chan Event, EventBuffer),
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { _ = conn.Close() })
	dec := json.NewDecoder(bufio.NewReader(conn))
	var g reply
	err := dec.Decode(&g)
	if err == nil && g.QMP == nil {
		err = fmt.Errorf("unexpected first message (no QMP greeting)")
	}
	if !stop() || ctx.Err() != nil {
		return nil, fmt.Errorf("qmp: greeting: %w", ctx.Err())
	}
	if err != nil {
		return nil, fmt.Errorf("qmp: greeting: %w", err)
	}
	_ = conn.SetDeadline(time.Time{})
	c.Greeting = g.QMP.Version
	go c.readLoop(dec)
	if err := c.Execute(ctx, "qmp_capabilities", nil, nil); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

func (c *Client) readLoop(dec *json.Decoder) {
	var err error
	for {
		var r reply
		if err = dec.Decode(&r); err != nil {
			break
		}
		if r.Event != "" {
			ev := Event{Name: r.Event, Data: r.Data}
			if r.Timestamp != nil {
				ev.Seconds, ev.Microsecs = r.Timestamp.Seconds, r.Timestamp.Microseconds
			}
			select {
			case c.events <- ev:
			default:
			}
			continue
		}
		if r.ID == nil {
			continue
		}
		c.mu.Lock()
		ch := c.wait[*r.ID]
		delete(c.wait, *r.ID)
		c.mu.Unlock()
		if ch != nil {
			ch <- r
		}
	}
	if errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) {
		err = ErrClosed
	} else {
		err = fmt.Errorf("%w: %w", ErrClosed, err)
	}
	c.mu.Lock()
	c.closed = true
	c.err = err
	for id, ch := range c.wait {
		close(ch)
		delete(c.wait, id)
	}
	c.mu.Unlock()
	close(c.done)
	close(c.events)
}

// Events delivers asynchronous events in arrival order. The channel is
// closed when the connection ends. Events arriving while EventBuffer are
// unread are dropped.
func (c *Client) Events() <-chan Event { return c.events }

// Done is closed when the connection has ended (for example after quit).
func (c *Client) Done() <-chan struct{} { return c.done }

// Close ends the session. It does not stop the VM.
func (c *Client) Close() error {
	err := c.conn.Close()
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}

// Execute sends command with arguments (nil for none; any value that
// marshals to a JSON object) and decodes the "return" member into result
// (nil to ignore it). A QMP error reply is returned as *Error. If ctx ends
// first the command may still run in qemu; ctx.Err() is returned wrapped.
func (c *Client) Execute(ctx context.Context, command string, arguments, result any) error {
	ch, err := c.send(command, arguments)
	if err != nil {
		return err
	}
	select {
	case r, ok := <-ch:
		if !ok {
			return fmt.Errorf("qmp: %s: %w", command, c.closeErr())
		}
		if r.Error != nil {
			return &Error{Command: command, Class: r.Error.Class, Desc: r.Error.Desc}
		}
		if result != nil && len(r.Return) > 0 {
			if err := json.Unmarshal(r.Return, result); err != nil {
				return fmt.Errorf("qmp: %s: decode reply: %w", command, err)
			}
		}
		return nil
	case <-ctx.Done():
		return fmt.Errorf("qmp: %s: %w", command, ctx.Err())
	}
}

func (c *Client) closeErr() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return c.err
	}
	return ErrClosed
}

func (c *Client) send(command string, arguments any) (chan reply, error) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, fmt.Errorf("qmp: %s: %w", command, c.closeErrLocked())
	}
	c.nextID++
	id := c.nextID
	ch := make(chan reply, 1)
	c.wait[id] = ch
	c.mu.Unlock()
	msg := struct {
		Execute   string `json:"execute"`
		Arguments any    `json:"arguments,omitempty"`
		ID        uint64 `json:"id"`
	}{command, arguments, id}
	b, err := json.Marshal(msg)
	if err != nil {
		c.forget(id)
		return nil, fmt.Errorf("qmp: %s: encode: %w", command, err)
	}
	c.wmu.Lock()
	_, err = c.conn.Write(append(b, '\n'))
	c.wmu.Unlock()
	if err != nil {
		c.forget(id)
		return nil, fmt.Errorf("qmp: %s: write: %w", command, err)
	}
	return ch, nil
}

func (c *Client) closeErrLocked() error {
	if c.err != nil {
		return c.err
	}
	return ErrClosed
}

func (c *Client) forget(id uint64) {
	c.mu.Lock()
	delete(c.wait, id)
	c.mu.Unlock()
}
