// Package httpstatus records the status code a handler gave an
// http.ResponseWriter, for metrics, logs and hooks that act on the
// outcome of a request, without costing the response its fast paths.
package httpstatus

import (
	"io"
	"net/http"
)

// Recorder wraps an http.ResponseWriter and keeps the status code of the
// response in Code: the first WriteHeader's code, or 200 when Write or
// ReadFrom came first; 0 while nothing was written. It forwards ReadFrom
// (so http.ServeContent of an *os.File keeps sendfile(2) on a TCP
// connection: without it every byte of the ramdisk, boot files and images
// went through a 32 KiB user-space copy, 62% of the server's CPU in
// bench/bootstorm.sh's ramdisk step), Flush (server-sent events) and
// Unwrap (http.ResponseController). Not safe for concurrent use, as an
// http.ResponseWriter is not.
type Recorder struct {
	http.ResponseWriter
	Code int
}

// WriteHeader records code (the first one) and passes it on.
func (w *Recorder) WriteHeader(code int) {
	if w.Code == 0 {
		w.Code = code
	}
	w.ResponseWriter.WriteHeader(code)
}

// Write records 200 if no status was written, and passes b on.
func (w *Recorder) Write(b []byte) (int, error) {
	if w.Code == 0 {
		w.Code = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// ReadFrom records 200 if no status was written and passes r to the
// wrapped writer's own ReadFrom when it has one.
func (w *Recorder) ReadFrom(r io.Reader) (int64, error) {
	if w.Code == 0 {
		w.Code = http.StatusOK
	}
	if rf, ok := w.ResponseWriter.(io.ReaderFrom); ok {
		return rf.ReadFrom(r)
	}
	return io.Copy(struct{ io.Writer }{w.ResponseWriter}, r)
}

// Flush flushes the wrapped writer if it can.
func (w *Recorder) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap returns the wrapped writer (http.ResponseController).
func (w *Recorder) Unwrap() http.ResponseWriter { return w.ResponseWriter }
