package state

import (
	"bytes"
	"encoding/json"
	"hash/maphash"
	"iter"
	"maps"
	"math"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"unsafe"
	"weak"
)

// BIOSValues are a BIOS reading's attribute values by name (Redfish
// Bios.Attributes): each a string, an int64 (every integral number, also
// one decoded from JSON as float64), a float64, a bool, or nil (a
// Password reads back as null). The zero value holds none. A BIOSValues
// is immutable, so copies and readings may share it; its JSON is the
// object a map[string]any of the same entries encodes to, byte for byte.
//
// The entries are kept sorted by name in chunks whose boundaries depend
// only on the names, so two readings of one server model hold equal
// chunks wherever their values agree: the store keeps one copy of each
// distinct chunk (serverCache), and a server whose reading differs from
// its peers' in one attribute holds one chunk of its own (about 16
// entries), not a whole reading. Safe for concurrent use.
type BIOSValues struct {
	chunks []*biosChunk
	n      int
}

// biosChunk is a run of entries sorted by name, never modified once
// built.
type biosChunk struct {
	names []string
	vals  []any
	// sum hashes the names and values; shareable is false when a value
	// is of another type than BIOSValues lists (never interned).
	sum       uint64
	shareable bool
	// frag is the chunk's JSON members (`"name":value,...`), made at
	// the first encoding.
	frag atomic.Pointer[[]byte]
}

// Chunk bounds: a chunk ends after a name whose seeded hash has its low
// chunkBits bits zero (so on average every 1<<chunkBits entries), or at
// maxChunk entries.
const (
	chunkBits = 4
	maxChunk  = 64
)

// chunkSeed seeds the boundary hash: chunks are shared within a process.
var chunkSeed = maphash.MakeSeed()

// NewBIOSValues returns the values of m (nil or empty: none), with every
// integral number made an int64 as bmc.NormalizeValue does. m is not
// retained.
func NewBIOSValues(m map[string]any) BIOSValues {
	if len(m) == 0 {
		return BIOSValues{}
	}
	names := slices.Sorted(maps.Keys(m))
	v := BIOSValues{n: len(names)}
	start := 0
	for i, name := range names {
		if i+1 < len(names) && i+1-start < maxChunk && maphash.String(chunkSeed, name)&(1<<chunkBits-1) != 0 {
			continue
		}
		c := &biosChunk{names: slices.Clone(names[start : i+1]), vals: make([]any, i+1-start)}
		for j, n := range c.names {
			c.vals[j] = canonicalValue(m[n])
		}
		c.seal()
		v.chunks = append(v.chunks, c)
		start = i + 1
	}
	return v
}

// canonicalValue makes an integral number an int64 (a JSON number
// decodes as float64; the Redfish driver reads int64), as
// bmc.NormalizeValue; -0 stays a float64, whose JSON differs.
func canonicalValue(v any) any {
	switch x := v.(type) {
	case float64:
		if x == math.Trunc(x) && math.Abs(x) < 1<<53 && !(x == 0 && math.Signbit(x)) {
			return int64(x)
		}
	case int:
		return int64(x)
	case int32:
		return int64(x)
	}
	return v
}

// seal computes c's hash and whether it can be shared.
func (c *biosChunk) seal() {
	var h maphash.Hash
	h.SetSeed(cacheSeed)
	c.shareable = true
	for i, name := range c.names {
		h.WriteString(name)
		h.WriteByte(0)
		switch x := c.vals[i].(type) {
		case nil:
			h.WriteByte(1)
		case string:
			h.WriteByte(2)
			h.WriteString(x)
		case int64:
			h.WriteByte(3)
			maphash.WriteComparable(&h, x)
		case float64:
			h.WriteByte(4)
			maphash.WriteComparable(&h, math.Float64bits(x))
		case bool:
			h.WriteByte(5)
			maphash.WriteComparable(&h, x)
		default:
			c.shareable = false
		}
	}
	c.sum = h.Sum64()
}

// equal reports whether c and d hold the same names and values.
func (c *biosChunk) equal(d *biosChunk) bool {
	return c == d || (c.sum == d.sum && slices.Equal(c.names, d.names) && slices.EqualFunc(c.vals, d.vals, sameValue))
}

// sameValue compares two values; those of the types BIOSValues lists
// compare with ==, others (which never share a chunk) deeply.
func sameValue(a, b any) bool {
	switch a.(type) {
	case nil, string, int64, float64, bool:
		return a == b
	}
	return reflect.DeepEqual(a, b)
}

// Len returns how many attributes there are.
func (v BIOSValues) Len() int { return v.n }

// IsZero reports whether v holds no attribute (the field is then left
// out of JSON, as an empty map with omitempty was).
func (v BIOSValues) IsZero() bool { return v.n == 0 }

// Get returns the value of attribute name and whether it is there.
func (v BIOSValues) Get(name string) (any, bool) {
	i := sort.Search(len(v.chunks), func(i int) bool {
		c := v.chunks[i]
		return c.names[len(c.names)-1] >= name
	})
	if i == len(v.chunks) {
		return nil, false
	}
	c := v.chunks[i]
	j, ok := slices.BinarySearch(c.names, name)
	if !ok {
		return nil, false
	}
	return c.vals[j], true
}

// Value returns the value of attribute name, nil when it is not there
// (as indexing a map does).
func (v BIOSValues) Value(name string) any {
	val, _ := v.Get(name)
	return val
}

// All yields every attribute and its value, sorted by name.
func (v BIOSValues) All() iter.Seq2[string, any] {
	return func(yield func(string, any) bool) {
		for _, c := range v.chunks {
			for i, name := range c.names {
				if !yield(name, c.vals[i]) {
					return
				}
			}
		}
	}
}

// Map returns the values as a new map.
func (v BIOSValues) Map() map[string]any {
	m := make(map[string]any, v.n)
	for name, val := range v.All() {
		m[name] = val
	}
	return m
}

// With returns v with attribute name set to val (v is unchanged).
func (v BIOSValues) With(name string, val any) BIOSValues {
	m := v.Map()
	m[name] = val
	return NewBIOSValues(m)
}

// Equal reports whether v and w hold the same attributes and values.
func (v BIOSValues) Equal(w BIOSValues) bool {
	if v.n != w.n {
		return false
	}
	next, stop := iter.Pull2(w.All())
	defer stop()
	for name, val := range v.All() {
		wn, wv, _ := next()
		if name != wn || !sameValue(val, wv) {
			return false
		}
	}
	return true
}

// MarshalJSON encodes v as a JSON object sorted by name, the bytes
// encoding/json makes of a map[string]any holding the same entries.
func (v BIOSValues) MarshalJSON() ([]byte, error) {
	size := 2
	for _, c := range v.chunks {
		f, err := c.members()
		if err != nil {
			return nil, err
		}
		size += len(f) + 1
	}
	out := make([]byte, 0, size)
	out = append(out, '{')
	for i, c := range v.chunks {
		if i > 0 {
			out = append(out, ',')
		}
		f, _ := c.members()
		out = append(out, f...)
	}
	return append(out, '}'), nil
}

// members returns the chunk's JSON object members, made once. HTML
// characters are left as they are: encoding/json escapes a Marshaler's
// output itself when its caller asks for it.
func (c *biosChunk) members() ([]byte, error) {
	if f := c.frag.Load(); f != nil {
		return *f, nil
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	var out []byte
	for i, name := range c.names {
		if i > 0 {
			out = append(out, ',')
		}
		buf.Reset()
		if err := enc.Encode(name); err != nil {
			return nil, err
		}
		out = append(out, bytes.TrimSuffix(buf.Bytes(), []byte{'\n'})...)
		out = append(out, ':')
		switch x := c.vals[i].(type) {
		case string:
			buf.Reset()
			if err := enc.Encode(x); err != nil {
				return nil, err
			}
			out = append(out, bytes.TrimSuffix(buf.Bytes(), []byte{'\n'})...)
		case int64:
			out = strconv.AppendInt(out, x, 10)
		case bool:
			out = strconv.AppendBool(out, x)
		case nil:
			out = append(out, "null"...)
		default:
			buf.Reset()
			if err := enc.Encode(x); err != nil {
				return nil, err
			}
			out = append(out, bytes.TrimSuffix(buf.Bytes(), []byte{'\n'})...)
		}
	}
	out = slices.Clip(out)
	c.frag.Store(&out)
	return out, nil
}

// UnmarshalJSON decodes a JSON object (or null: none).
func (v *BIOSValues) UnmarshalJSON(data []byte) error {
	var m map[string]any
	if err := json.Unmarshal(data, &m); err != nil {
		return err
	}
	*v = NewBIOSValues(m)
	return nil
}

// chunkInterner keeps one copy of each distinct BIOSValues chunk among
// the records a serverCache holds, found by the chunk's hash and checked
// equal before it is shared. It holds them weakly: a chunk no record
// holds any more is collected, and its entry dropped when the table
// fills (maxInternedChunks).
type chunkInterner struct {
	mu sync.Mutex
	m  map[uint64]weak.Pointer[biosChunk]
}

// maxInternedChunks bounds the interner's table.
const maxInternedChunks = 1 << 16

// intern returns v with each chunk replaced by the kept copy of an equal
// one (its own chunks kept for later readings otherwise); v itself is
// not modified.
func (r *chunkInterner) intern(v BIOSValues) BIOSValues {
	var out []*biosChunk
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, c := range v.chunks {
		if !c.shareable {
			continue
		}
		if kept := r.m[c.sum].Value(); kept != nil && kept.equal(c) {
			if kept != c {
				if out == nil {
					out = slices.Clone(v.chunks)
				}
				out[i] = kept
			}
			continue
		}
		if r.m == nil || len(r.m) >= maxInternedChunks {
			r.prune()
		}
		r.m[c.sum] = weak.Make(c)
	}
	if out == nil {
		return v
	}
	return BIOSValues{chunks: out, n: v.n}
}

// prune drops the entries of collected chunks, and starts the table
// again when that leaves it over half full (records keep what they
// share).
func (r *chunkInterner) prune() {
	maps.DeleteFunc(r.m, func(_ uint64, p weak.Pointer[biosChunk]) bool { return p.Value() == nil })
	if r.m == nil || len(r.m) >= maxInternedChunks/2 {
		r.m = map[uint64]weak.Pointer[biosChunk]{}
	}
}

// internIn replaces srv's BIOS values by a BIOSValues sharing the kept
// chunks; the reading is copied first so that no other holder of srv's
// reading sees the change.
func (r *chunkInterner) internIn(srv *Server) {
	if srv.Firmware == nil || srv.Firmware.BIOS == nil || srv.Firmware.BIOS.Attributes.IsZero() {
		return
	}
	vals := r.intern(srv.Firmware.BIOS.Attributes)
	if len(vals.chunks) > 0 && &vals.chunks[0] == &srv.Firmware.BIOS.Attributes.chunks[0] {
		return
	}
	fw := *srv.Firmware
	bios := *fw.BIOS
	bios.Attributes = vals
	fw.BIOS = &bios
	srv.Firmware = &fw
}

// componentInterner keeps one copy of each distinct firmware inventory
// (Firmware.Components) among the records a serverCache holds: servers of
// one model and firmware level list the same components and versions
// (an iDRAC 9 about 30). Held weakly, as chunkInterner holds chunks.
type componentInterner struct {
	mu sync.Mutex
	m  map[uint64]keptComponents
}

// keptComponents is a weak pointer to a kept list's first element and
// its length.
type keptComponents struct {
	first weak.Pointer[FirmwareComponent]
	n     int
}

// slice returns the kept list, or nil once it was collected.
func (k keptComponents) slice() []FirmwareComponent {
	p := k.first.Value()
	if p == nil {
		return nil
	}
	// p is the first element of an array of at least n (the list the
	// entry was made from, which starts its allocation).
	return unsafe.Slice(p, k.n)
}

// internIn replaces srv's firmware inventory by the kept copy of an equal
// one, or keeps srv's; the reading is copied first so that no other
// holder of srv's reading sees the change.
func (r *componentInterner) internIn(srv *Server) {
	if srv.Firmware == nil || len(srv.Firmware.Components) == 0 {
		return
	}
	comps := srv.Firmware.Components
	var h maphash.Hash
	h.SetSeed(cacheSeed)
	for _, c := range comps {
		maphash.WriteComparable(&h, c)
	}
	sum := h.Sum64()
	r.mu.Lock()
	kept := r.m[sum].slice()
	if kept == nil || !slices.Equal(kept, comps) {
		if r.m == nil || len(r.m) >= maxInternedChunks {
			maps.DeleteFunc(r.m, func(_ uint64, k keptComponents) bool { return k.first.Value() == nil })
			if r.m == nil || len(r.m) >= maxInternedChunks/2 {
				r.m = map[uint64]keptComponents{}
			}
		}
		comps = slices.Clip(slices.Clone(comps)) // starts its own allocation
		r.m[sum] = keptComponents{first: weak.Make(&comps[0]), n: len(comps)}
		kept = comps
	}
	r.mu.Unlock()
	if &kept[0] == &srv.Firmware.Components[0] {
		return
	}
	fw := *srv.Firmware
	fw.Components = kept
	srv.Firmware = &fw
}
