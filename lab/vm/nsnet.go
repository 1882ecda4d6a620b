package vm

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"runtime"
	"time"

	"golang.org/x/sys/unix"
)

// inNetns runs fn on an OS thread that has entered the network namespace
// name (setns(2) on /run/netns/NAME), then returns the thread to its own
// namespace. Sockets fn creates belong to that namespace for their whole
// life, whichever goroutine uses them later. The process as a whole (its
// main thread, which `ip netns pids` looks at) never changes namespace.
func inNetns(name string, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("open own netns: %w", err)
			return
		}
		defer unix.Close(orig)
		fd, err := unix.Open("/run/netns/"+name, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("open netns %s: %w", name, err)
			return
		}
		err = unix.Setns(fd, unix.CLONE_NEWNET)
		_ = unix.Close(fd)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("setns %s: %w", name, err)
			return
		}
		ferr := fn()
		// Back to the original namespace; only then may the thread run
		// other goroutines. If that fails the thread stays locked and the
		// runtime discards it when this goroutine ends (unless it is the
		// main thread, which the runtime keeps wedged: still never reused).
		if unix.Setns(orig, unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		}
		errc <- ferr
	}()
	return <-errc
}

// listenIn opens a TCP listener on addr inside the namespace.
func listenIn(ns, addr string) (net.Listener, error) {
	var ln net.Listener
	err := inNetns(ns, func() (err error) {
		ln, err = net.Listen("tcp", addr)
		return err
	})
	return ln, err
}

// nsHTTPClient is an HTTP client whose connections are made inside the
// namespace, so the harness (in the host namespace) reaches the
// controller's API at its namespace address.
func nsHTTPClient(ns string) *http.Client {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			var c net.Conn
			err := inNetns(ns, func() (err error) {
				c, err = (&net.Dialer{}).DialContext(ctx, network, addr)
				return err
			})
			return c, err
		},
		MaxIdleConnsPerHost: 4,
	}
	return &http.Client{Transport: tr, Timeout: 30 * time.Second}
}
