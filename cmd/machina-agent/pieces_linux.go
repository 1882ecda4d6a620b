package main

import (
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"time"

	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/ramdisk/agent"
)

// servePieces starts the deploy's piece listener on v1.DefaultPeerPort
// (every address) and names it to r, so the controller can put the
// machine in its wave; the returned func closes it. A port that cannot be
// bound leaves the deploy fetching the whole image from the controller.
func servePieces(r *agent.Runner, log *slog.Logger) func() {
	ln, err := net.Listen("tcp", ":"+strconv.Itoa(v1.DefaultPeerPort))
	if err != nil {
		log.Warn("piece listener; deploying without sharing", "err", err)
		return func() {}
	}
	ps := &agent.PeerServer{}
	srv := &http.Server{Handler: ps, ReadHeaderTimeout: 10 * time.Second, WriteTimeout: 2 * time.Minute}
	go func() { _ = srv.Serve(ln) }()
	r.Pieces, r.PiecePort = ps, v1.DefaultPeerPort
	return func() { _ = srv.Close() }
}
