package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"

	"github.com/coder/websocket"
	"github.com/spf13/cobra"
	"golang.org/x/term"
)

// newConsoleCmd is `machinactl console NAME`: attach the terminal to a
// server's serial console over the API's WebSocket
// (/api/v1/servers/{name}/console). The terminal is in raw mode while
// attached; "~." at the start of a line leaves.
func newConsoleCmd(e *env) *cobra.Command {
	var api string
	cmd := &cobra.Command{
		Use:   "console NAME",
		Short: "Attach to a server's serial console (leave with ~. at the start of a line)",
		Long: "Attach to a server's serial console through the Machina API.\n" +
			"The API URL comes from --api or MACHINA_API, the admin token from MACHINA_TOKEN.\n" +
			"The first client attached to a console may type; later ones are read-only.\n" +
			"Type ~. at the start of a line to leave.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if api == "" {
				api = os.Getenv("MACHINA_API")
			}
			return runConsole(cmd.Context(), e, api, os.Getenv("MACHINA_TOKEN"), args[0])
		},
	}
	cmd.Flags().StringVar(&api, "api", "", "Machina API base URL, e.g. https://machina.example:8444 (env MACHINA_API)")
	return cmd
}

// consoleURL turns the API base URL and a server name into the WebSocket URL.
func consoleURL(api, name string) (string, error) {
	if api == "" {
		return "", errors.New("console: no API URL (use --api or MACHINA_API)")
	}
	u, err := url.Parse(api)
	if err != nil {
		return "", fmt.Errorf("console: API URL: %w", err)
	}
	switch u.Scheme {
	case "http":
		u.Scheme = "ws"
	case "https":
		u.Scheme = "wss"
	case "ws", "wss":
	default:
		return "", fmt.Errorf("console: API URL %q: scheme must be http or https", api)
	}
	if name == "" || strings.ContainsAny(name, "/?#%") {
		return "", fmt.Errorf("console: invalid server name %q", name)
	}
	u.Path = strings.TrimSuffix(u.Path, "/") + "/api/v1/servers/" + url.PathEscape(name) + "/console"
	u.RawQuery, u.Fragment = "", ""
	return u.String(), nil
}

func runConsole(ctx context.Context, e *env, api, token, name string) error {
	wsURL, err := consoleURL(api, name)
	if err != nil {
		return &exitError{code: 2, err: err}
	}
	if token == "" {
		return &exitError{code: 2, err: errors.New("console: MACHINA_TOKEN is not set")}
	}
	if _, err := e.conn.checkAPIURL(api); err != nil {
		return err
	}
	hc, err := e.conn.httpClient()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	conn, resp, err := websocket.Dial(ctx, wsURL, &websocket.DialOptions{
		HTTPHeader: http.Header{"Authorization": {"Bearer " + token}},
		HTTPClient: hc,
	})
	if err != nil {
		if resp != nil && resp.StatusCode != http.StatusSwitchingProtocols {
			body := ""
			if resp.Body != nil {
				b, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
				body = strings.TrimSpace(string(b))
			}
			return &exitError{code: 1, err: fmt.Errorf("console %s: %s: %s", name, resp.Status, body)}
		}
		return &exitError{code: 1, err: fmt.Errorf("console %s: %w", name, err)}
	}
	defer conn.CloseNow()
	role := resp.Header.Get("X-Machina-Console-Role")

	// Raw mode when stdin is a terminal, restored on every return path.
	if f, ok := e.stdin.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		old, err := term.MakeRaw(int(f.Fd()))
		if err != nil {
			return fmt.Errorf("console: raw mode: %w", err)
		}
		defer term.Restore(int(f.Fd()), old)
	}
	fmt.Fprintf(e.stderr, "[connected to %s as %s; ~. to leave]\r\n", name, role)

	outDone, inDone := make(chan error, 1), make(chan error, 1)
	go consoleOut(ctx, conn, e.stdout, outDone)
	go consoleIn(ctx, conn, e.stdin, inDone)
	select {
	case err := <-inDone:
		_ = conn.Close(websocket.StatusNormalClosure, "detached")
		fmt.Fprintf(e.stderr, "\r\n[detached from %s]\r\n", name)
		if err != nil && !errors.Is(err, io.EOF) && ctx.Err() == nil {
			return &exitError{code: 1, err: fmt.Errorf("console %s: %w", name, err)}
		}
		return nil
	case err := <-outDone:
		status := websocket.CloseStatus(err)
		if status == websocket.StatusNormalClosure || errors.Is(err, context.Canceled) {
			fmt.Fprintf(e.stderr, "\r\n[console %s closed]\r\n", name)
			return nil
		}
		var ce websocket.CloseError
		if errors.As(err, &ce) {
			return &exitError{code: 1, err: fmt.Errorf("console %s closed by server: %s", name, ce.Reason)}
		}
		return &exitError{code: 1, err: fmt.Errorf("console %s: %w", name, err)}
	}
}

// consoleOut copies the server's console output to the terminal until
// either fails, and sends why on done.
func consoleOut(ctx context.Context, conn *websocket.Conn, out io.Writer, done chan<- error) {
	for {
		_, b, err := conn.Read(ctx)
		if err != nil {
			done <- err
			return
		}
		if _, err := out.Write(b); err != nil {
			done <- err
			return
		}
	}
}

// consoleIn copies the terminal's input to the server, watching for the
// "~." escape (nil on done) until either side fails.
func consoleIn(ctx context.Context, conn *websocket.Conn, in io.Reader, done chan<- error) {
	esc := &escapeFilter{atLineStart: true}
	buf := make([]byte, 1024)
	for {
		n, err := in.Read(buf)
		if n > 0 {
			out, leave := esc.filter(buf[:n])
			if len(out) > 0 {
				if werr := conn.Write(ctx, websocket.MessageBinary, out); werr != nil {
					done <- werr
					return
				}
			}
			if leave {
				done <- nil
				return
			}
		}
		if err != nil {
			done <- err
			return
		}
	}
}

// escapeFilter finds the "~." escape at the start of a line (after CR or
// LF, or at the very start), as ssh does. A "~" at line start is held until
// the next byte: "~." leaves, "~~" sends one "~", anything else sends both.
type escapeFilter struct {
	atLineStart  bool
	pendingTilde bool
}

// filter returns the bytes to send and whether the escape was typed (bytes
// after it are dropped).
func (f *escapeFilter) filter(in []byte) (out []byte, leave bool) {
	for _, c := range in {
		if f.pendingTilde {
			f.pendingTilde = false
			switch c {
			case '.':
				return out, true
			case '~':
				out = append(out, '~')
				f.atLineStart = false
				continue
			default:
				out = append(out, '~')
			}
		} else if f.atLineStart && c == '~' {
			f.pendingTilde = true
			continue
		}
		out = append(out, c)
		f.atLineStart = c == '\r' || c == '\n'
	}
	return out, false
}
