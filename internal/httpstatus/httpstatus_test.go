package httpstatus

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestRecorder: the first status wins, a body without a status is 200,
// nothing written is 0, and ReadFrom and Flush reach the wrapped writer.
func TestRecorder(t *testing.T) {
	rr := httptest.NewRecorder()
	w := &Recorder{ResponseWriter: rr}
	if w.Code != 0 {
		t.Fatalf("code before any write = %d", w.Code)
	}
	w.WriteHeader(http.StatusTeapot)
	w.WriteHeader(http.StatusOK)
	if w.Code != http.StatusTeapot {
		t.Errorf("code = %d, want the first, %d", w.Code, http.StatusTeapot)
	}
	w2 := &Recorder{ResponseWriter: httptest.NewRecorder()}
	if _, err := w2.ReadFrom(strings.NewReader("body")); err != nil || w2.Code != http.StatusOK {
		t.Errorf("ReadFrom: code %d, err %v; want 200", w2.Code, err)
	}
	if got := w2.ResponseWriter.(*httptest.ResponseRecorder).Body.String(); got != "body" {
		t.Errorf("ReadFrom wrote %q", got)
	}
	w3 := &Recorder{ResponseWriter: rr}
	w3.Flush()
	if !rr.Flushed {
		t.Error("Flush did not reach the wrapped writer")
	}
	if http.NewResponseController(w3) == nil || w3.Unwrap() != rr {
		t.Error("Unwrap does not return the wrapped writer")
	}
}
