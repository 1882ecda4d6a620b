package ipxe

import (
	"net/url"
	"testing"
)

var scriptQuerySeeds = []string{
	"", "mac=52-54-00-12-34-56", "mac=52-54-00-12-34-56&platform=efi&arch=x86_64",
	"platform=pcbios&mac=52%3A54%3A00%3A12%3A34%3A56", "mac=a&mac=b", "mac=%zz&mac=b", "mac=%zz",
	"m%61c=x", "mac=a;b&mac=c", "mac;=x&arch=arm64", "&&mac=&arch", "arch=a+b", "mac", "=x&platform=efi",
	"platform=%2", "mac=1&platform=2&arch=3&mac=4&platform=5&arch=6",
}

// TestScriptQueryMatchesURL: scriptQuery reads what url.ParseQuery and
// Get read (first value, skipped pairs with a semicolon or a bad escape).
func TestScriptQueryMatchesURL(t *testing.T) {
	for _, raw := range scriptQuerySeeds {
		checkScriptQuery(t, raw)
	}
}

func FuzzScriptQuery(f *testing.F) {
	for _, s := range scriptQuerySeeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) { checkScriptQuery(t, raw) })
}

func checkScriptQuery(t *testing.T, raw string) {
	t.Helper()
	want, _ := url.ParseQuery(raw)
	got := scriptQuery(raw)
	if got.mac != want.Get("mac") || got.platform != want.Get("platform") || got.arch != want.Get("arch") {
		t.Errorf("scriptQuery(%q) = %+v, url.ParseQuery gives mac %q platform %q arch %q", raw, got, want.Get("mac"), want.Get("platform"), want.Get("arch"))
	}
}
