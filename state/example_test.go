package state_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/machina-metal/machina/state"
)

// A lifecycle move is compare-and-set: it names the lifecycle the caller
// believes the server is in, and a refused move reports the current one.
func ExampleStore_Transition() {
	dir, _ := os.MkdirTemp("", "state-example")
	defer os.RemoveAll(dir)
	s, err := state.Open(filepath.Join(dir, "state.db"), state.Options{})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer s.Close()
	if _, err := s.CreateServer(state.Server{Name: "r1-n01", Zone: "zone-a"}); err != nil {
		fmt.Println(err)
		return
	}
	srv, _ := s.Transition("r1-n01", state.LifecycleNew, state.LifecycleCommissioning, "commission")
	fmt.Println(srv.Lifecycle)

	_, err = s.Transition("r1-n01", state.LifecycleNew, state.LifecycleCommissioning, "again")
	var te *state.TransitionError
	if errors.As(err, &te) {
		fmt.Println(errors.Is(err, state.ErrStaleTransition), te.Current)
	}
	// Output:
	// commissioning
	// true commissioning
}
