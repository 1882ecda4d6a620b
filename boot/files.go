package boot

import (
	"fmt"
	"net/http"
	"os"
	"strings"
)

// FileOptions shape what [ServeFile] and [Files] answer. The zero value
// serves any regular, non-hidden file as application/octet-stream.
type FileOptions struct {
	// ContentType is the Content-Type of every answer; empty means
	// application/octet-stream.
	ContentType string
	// Ext, when set, is the suffix every served name must end in
	// (".iso"); other names answer 404.
	Ext string
	// Hidden allows path elements that start with "." (a RHEL installer
	// tree's .treeinfo and .discinfo, which anaconda fetches). "." and ".."
	// are refused whatever it says.
	Hidden bool
	// Flat refuses names with a "/": only the folder's own files are
	// served, none of its subfolders'.
	Flat bool
	// NoStore sets Cache-Control: no-store (files a token gates).
	NoStore bool
}

// ServeFile answers r with the regular file name, a slash-separated path
// relative to root, or 404. It is the one implementation behind every boot
// file and installer tree Machina serves over HTTP (/boot/ramdisk/,
// /boot/iso/, /boot/bin/, the installer tree and ISO): callers check tokens
// first, then call it.
//
// Refused with 404, before any file is opened: an empty name, a name that is
// not in clean form (path.Clean; so no "a/../b", "//" or trailing "/"), a
// leading "/", a "." or ".." element, a backslash or NUL, a hidden element
// unless opt.Hidden, a name without opt.Ext, a "/" when opt.Flat. Opened through root (an
// [os.Root]), so a symlink or ".." that resolves outside the root's folder is
// refused by the kernel-checked walk (Go 1.24 os.Root), and a symlink within
// it is followed. Directories, devices and FIFOs answer 404 (no listings).
//
// The body goes out through [http.ServeContent] over the *os.File, so Range
// (RFC 9110 §14), If-Modified-Since and HEAD work, and net/http sends it with
// sendfile(2) on a plain TCP connection.
func ServeFile(w http.ResponseWriter, r *http.Request, root *os.Root, name string, opt FileOptions) {
	if !servableName(name, opt) {
		http.NotFound(w, r)
		return
	}
	f, err := root.Open(name)
	if err != nil {
		http.NotFound(w, r)
		return
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil || !st.Mode().IsRegular() {
		http.NotFound(w, r)
		return
	}
	ct := opt.ContentType
	if ct == "" {
		ct = "application/octet-stream"
	}
	w.Header().Set("Content-Type", ct)
	if opt.NoStore {
		w.Header().Set("Cache-Control", "no-store")
	}
	http.ServeContent(w, r, "", st.ModTime(), f)
}

func servableName(name string, opt FileOptions) bool {
	if name == "" || len(name) > 1024 || strings.ContainsAny(name, "\\\x00") || !strings.HasSuffix(name, opt.Ext) ||
		(opt.Flat && strings.Contains(name, "/")) {
		return false
	}
	for _, e := range strings.Split(name, "/") {
		// An empty element is a leading, trailing or doubled "/".
		if e == "" || e == "." || e == ".." || (!opt.Hidden && e[0] == '.') {
			return false
		}
	}
	return true
}

// Files is an http.Handler serving one folder with [ServeFile]: the
// request's URL path, without its leading "/", names the file, so mount it
// under http.StripPrefix. Only GET and HEAD are answered (405 otherwise).
// Safe for concurrent use.
type Files struct {
	root *os.Root
	opt  FileOptions
}

// OpenFiles opens dir as an [os.Root] for a [Files]. Close releases it.
func OpenFiles(dir string, opt FileOptions) (*Files, error) {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, fmt.Errorf("open files: %w", err)
	}
	return &Files{root: root, opt: opt}, nil
}

// ServeHTTP implements http.Handler.
func (f *Files) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	ServeFile(w, r, f.root, strings.TrimPrefix(r.URL.Path, "/"), f.opt)
}

// Serve answers r with name ([ServeFile] rules) from f's folder.
func (f *Files) Serve(w http.ResponseWriter, r *http.Request, name string) {
	ServeFile(w, r, f.root, name, f.opt)
}

// Close releases the folder.
func (f *Files) Close() error { return f.root.Close() }
