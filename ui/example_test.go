package ui_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"

	"github.com/machina-metal/machina/api"
	"github.com/machina-metal/machina/console"
	"github.com/machina-metal/machina/state"
	"github.com/machina-metal/machina/ui"
)

// Example shows how cmd/machina mounts the UI on the admin API server, with
// one console handler shared by machinactl (bearer token) and browsers (UI
// session). The Opener, BMC, Images and Inventory sources are the
// controller's own (here: a console that refuses, and no sources).
func Example() {
	dir, err := os.MkdirTemp("", "machina-ui-example")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer os.RemoveAll(dir)
	st, err := state.Open(filepath.Join(dir, "state.db"), state.Options{})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer st.Close()
	apiSrv, err := api.New(api.Config{Store: st})
	if err != nil {
		fmt.Println(err)
		return
	}
	bearer := func(r *http.Request) (string, error) {
		tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok {
			return "", ui.ErrNoSession
		}
		at, err := st.AuthenticateAdmin(tok)
		return at.Name, err
	}
	con, err := console.New(console.Config{
		Opener: console.OpenerFunc(func(context.Context, string) (io.ReadWriteCloser, error) {
			return nil, console.ErrServerNotFound
		}),
		Authenticate: ui.ConsoleAuthenticate(bearer),
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := apiSrv.HandlePublic(console.Pattern, con); err != nil {
		fmt.Println(err)
		return
	}
	h, err := ui.New(ui.Config{Store: st, API: apiSrv.Handler(), Console: con})
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := apiSrv.HandlePublic(ui.Prefix, h); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("mounted at", ui.Prefix)
	// Output: mounted at /ui/
}
