package images

import (
	_ "embed"
	"errors"
	"fmt"
	"net/url"
	"path"
	"sort"
	"strings"

	"sigs.k8s.io/yaml"
)

//go:embed catalog.yaml
var catalogYAML []byte

// Errors returned by the catalog.
var (
	// ErrUnknownImage: no catalog entry has that name.
	ErrUnknownImage = errors.New("unknown catalog image")
	// ErrUnknownArch: the entry has no build for that architecture upstream.
	ErrUnknownArch = errors.New("architecture not published upstream")
	// ErrBadURL: a mirror or image URL is not an absolute http(s) URL.
	ErrBadURL = errors.New("invalid URL")
)

// CatalogEntry is one upstream image (see catalog.yaml for the layouts).
// Path is relative to Upstream and contains "{arch}", replaced by
// Arches[arch] (amd64 or arm64 mapped to the distribution's own name).
// ChecksumFile is a file name in the image's directory.
type CatalogEntry struct {
	Name         string            `json:"name"`
	Family       string            `json:"family"`
	Description  string            `json:"description"`
	Upstream     string            `json:"upstream"`
	Path         string            `json:"path"`
	ChecksumFile string            `json:"checksumFile"`
	Format       Format            `json:"format"`
	Arches       map[string]string `json:"arches"`
}

// Catalog is the set of known upstream images. The zero value is empty;
// [DefaultCatalog] returns the embedded one.
type Catalog struct {
	Images []CatalogEntry `json:"images"`
}

// Mirrors points the catalog at local mirrors. Base, when set, replaces every
// entry's upstream root. PerImage overrides Base for one image, keyed by
// catalog name (e.g. "ubuntu-24.04") or family ("ubuntu"); the name wins.
// Every value is an absolute http(s) or file URL of a directory laid out like
// upstream.
type Mirrors struct {
	Base     string
	PerImage map[string]string
}

// Source is a resolved catalog entry: where to download the image and its
// checksum file.
type Source struct {
	Catalog     string
	Arch        string // amd64 or arm64
	URL         string
	ChecksumURL string
}

// DefaultCatalog parses the embedded catalog.yaml.
func DefaultCatalog() (*Catalog, error) { return ParseCatalog(catalogYAML) }

// ParseCatalog parses and validates a catalog document (YAML, unknown fields
// refused): unique names, absolute https upstream roots, relative paths
// holding {arch}, a checksum file name, and at least one architecture.
func ParseCatalog(b []byte) (*Catalog, error) {
	var c Catalog
	if err := yaml.UnmarshalStrict(b, &c); err != nil {
		return nil, fmt.Errorf("parse catalog: %w", err)
	}
	seen := map[string]bool{}
	var errs []error
	for i, e := range c.Images {
		bad := func(msg string) { errs = append(errs, fmt.Errorf("catalog entry %d (%s): %s", i, e.Name, msg)) }
		if ValidateName(e.Name) != nil {
			bad("invalid name")
		}
		if seen[e.Name] {
			bad("duplicate name")
		}
		seen[e.Name] = true
		if u, err := url.Parse(e.Upstream); err != nil || u.Scheme != "https" || u.Host == "" || !strings.HasSuffix(u.Path, "/") {
			bad("upstream must be an https URL ending in /")
		}
		if strings.HasPrefix(e.Path, "/") || !strings.Contains(e.Path, "{arch}") || strings.Contains(e.Path, "..") {
			bad("path must be relative and contain {arch}")
		}
		if e.ChecksumFile == "" || strings.Contains(e.ChecksumFile, "/") {
			bad("checksumFile must be a file name")
		}
		if len(e.Arches) == 0 {
			bad("no architectures")
		}
		for a, v := range e.Arches {
			if a != "amd64" && a != "arm64" || v == "" || strings.ContainsAny(v, "/?#") {
				bad(fmt.Sprintf("bad architecture %q: %q", a, v))
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("parse catalog: %w", err)
	}
	return &c, nil
}

// Names returns the catalog's image names, sorted.
func (c *Catalog) Names() []string {
	var n []string
	for _, e := range c.Images {
		n = append(n, e.Name)
	}
	sort.Strings(n)
	return n
}

// Entry returns the entry called name, or an error wrapping [ErrUnknownImage].
func (c *Catalog) Entry(name string) (CatalogEntry, error) {
	for _, e := range c.Images {
		if e.Name == name {
			return e, nil
		}
	}
	return CatalogEntry{}, fmt.Errorf("catalog %q: %w (known: %s)", truncate(name, 80), ErrUnknownImage, strings.Join(c.Names(), ", "))
}

// Resolve returns the image and checksum-file URLs of catalog image name for
// arch ("" means amd64), rooted at the mirror m chooses or at upstream.
func (c *Catalog) Resolve(name, arch string, m Mirrors) (Source, error) {
	e, err := c.Entry(name)
	if err != nil {
		return Source{}, err
	}
	if arch == "" {
		arch = "amd64"
	}
	dist, ok := e.Arches[arch]
	if !ok {
		return Source{}, fmt.Errorf("catalog %s/%s: %w", name, truncate(arch, 20), ErrUnknownArch)
	}
	root := e.Upstream
	switch {
	case m.PerImage[e.Name] != "":
		root = m.PerImage[e.Name]
	case m.PerImage[e.Family] != "":
		root = m.PerImage[e.Family]
	case m.Base != "":
		root = m.Base
	}
	base, err := checkBaseURL(root)
	if err != nil {
		return Source{}, fmt.Errorf("catalog %s: mirror: %w", name, err)
	}
	rel := strings.ReplaceAll(e.Path, "{arch}", dist)
	img := base.JoinPath(rel)
	sum := base.JoinPath(path.Dir(rel), e.ChecksumFile)
	return Source{Catalog: e.Name, Arch: arch, URL: img.String(), ChecksumURL: sum.String()}, nil
}

// checkBaseURL validates a mirror root: absolute http, https or file URL,
// no query or fragment.
func checkBaseURL(s string) (*url.URL, error) {
	u, err := checkURL(s)
	if err != nil {
		return nil, err
	}
	if u.RawQuery != "" {
		return nil, fmt.Errorf("%w: mirror URL %q has a query", ErrBadURL, redact(s))
	}
	return u, nil
}

// checkURL validates an image or checksum URL: absolute http, https or file
// URL without a fragment. A query is allowed (signed URLs) and is redacted
// from records, logs and errors.
func checkURL(s string) (*url.URL, error) {
	u, err := url.Parse(s)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadURL, unwrapURLError(err))
	}
	if (u.Scheme != "http" && u.Scheme != "https" && u.Scheme != "file") || (u.Scheme != "file" && u.Host == "") || u.Fragment != "" {
		return nil, fmt.Errorf("%w: %q must be an absolute http(s) or file URL", ErrBadURL, redact(s))
	}
	return u, nil
}
