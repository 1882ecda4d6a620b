package images

import (
	"bytes"
	"encoding/binary"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
)

// nbdClient drives serveNBD over a net.Pipe with the NBD_OPT_GO handshake.
func nbdClient(t *testing.T, c net.Conn, size int64) {
	t.Helper()
	be := binary.BigEndian
	hdr := make([]byte, 18)
	if _, err := io.ReadFull(c, hdr); err != nil || be.Uint64(hdr) != nbdMagic || be.Uint64(hdr[8:]) != nbdOptMagic {
		t.Fatalf("server greeting %x, %v", hdr, err)
	}
	binary.Write(c, be, uint32(nbdFlagFixedNew|nbdFlagNoZeroes))
	// An unsupported option first (structured replies), then GO.
	for _, opt := range []uint32{8, nbdOptGo} {
		var data []byte
		if opt == nbdOptGo {
			data = []byte{0, 0, 0, 0, 0, 0}
		}
		b := make([]byte, 16)
		be.PutUint64(b, nbdOptMagic)
		be.PutUint32(b[8:], opt)
		be.PutUint32(b[12:], uint32(len(data)))
		c.Write(append(b, data...))
		for {
			rh := make([]byte, 20)
			if _, err := io.ReadFull(c, rh); err != nil {
				t.Fatal(err)
			}
			typ, n := be.Uint32(rh[12:]), be.Uint32(rh[16:])
			body := make([]byte, n)
			io.ReadFull(c, body)
			if typ == nbdRepInfo && int64(be.Uint64(body[2:])) != size {
				t.Fatalf("export size %d, want %d", be.Uint64(body[2:]), size)
			}
			if typ == nbdRepAck || typ == nbdRepErrUnsup {
				break
			}
		}
	}
}

func nbdWrite(t *testing.T, c net.Conn, off int64, data []byte) uint32 {
	t.Helper()
	be := binary.BigEndian
	b := make([]byte, 28)
	be.PutUint32(b, nbdRequestMagic)
	be.PutUint16(b[6:], nbdCmdWrite)
	be.PutUint64(b[8:], 42)
	be.PutUint64(b[16:], uint64(off))
	be.PutUint32(b[24:], uint32(len(data)))
	c.Write(append(b, data...))
	r := make([]byte, 16)
	if _, err := io.ReadFull(c, r); err != nil || be.Uint32(r) != nbdSimpleReply || be.Uint64(r[8:]) != 42 {
		t.Fatalf("write reply %x, %v", r, err)
	}
	return be.Uint32(r[4:])
}

func TestNBDSinkOrder(t *testing.T) {
	a := bytes.Repeat([]byte{1}, 4096)
	z := make([]byte, 4096)
	for _, tc := range []struct {
		name    string
		writes  []int64 // offsets; data at offset 4096 is zeros, else ones
		inOrder bool
	}{
		{"in order", []int64{0, 4096, 8192}, true},
		{"out of order", []int64{8192, 0, 4096}, false},
		{"rewrite", []int64{0, 4096, 8192, 0}, false},
		{"tail never written", []int64{0}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := os.Create(filepath.Join(t.TempDir(), "raw"))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			const size = 3 * 4096
			f.Truncate(size)
			sink := &nbdSink{f: f, size: size, h: SHA256.New(), prog: newProgressMeter("x", PhaseConvert, nil, nil, 0)}
			cs, cc := net.Pipe()
			done := make(chan error, 1)
			go func() { done <- serveNBD(cs, sink) }()
			nbdClient(t, cc, size)
			want := make([]byte, size)
			for _, off := range tc.writes {
				data := a
				if off == 4096 {
					data = z
				}
				if errno := nbdWrite(t, cc, off, data); errno != 0 {
					t.Fatalf("write at %d: errno %d", off, errno)
				}
				copy(want[off:], data)
			}
			if errno := nbdWrite(t, cc, size-10, a[:20]); errno != nbdEINVAL {
				t.Errorf("write past the end: errno %d, want EINVAL", errno)
			}
			b := make([]byte, 28)
			binary.BigEndian.PutUint32(b, nbdRequestMagic)
			binary.BigEndian.PutUint16(b[6:], nbdCmdDisc)
			cc.Write(b)
			if err := <-done; err != nil {
				t.Fatalf("serveNBD() = %v", err)
			}
			got, _ := os.ReadFile(f.Name())
			if !bytes.Equal(got, want) {
				t.Fatal("file content differs from the writes")
			}
			d, ok := sink.digest()
			if ok != tc.inOrder {
				t.Fatalf("digest ok = %v, want %v", ok, tc.inOrder)
			}
			if ok && d != sha256Of(want) {
				t.Errorf("in-flight digest %v, want %v", d, sha256Of(want))
			}
		})
	}
}
