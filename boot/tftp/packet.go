package tftp

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// TFTP opcodes (RFC 1350 §5, RFC 2347 §2 for OACK).
const (
	opRRQ   = 1
	opWRQ   = 2
	opDATA  = 3
	opACK   = 4
	opERROR = 5
	opOACK  = 6
)

// TFTP error codes (RFC 1350 §5, RFC 2347 §2 for 8).
const (
	codeUndefined  = 0
	codeNotFound   = 1
	codeAccess     = 2
	codeIllegalOp  = 4
	codeBadOptions = 8
)

// Option limits: blksize 8–65464 octets (RFC 2348 §2), windowsize 1–65535
// blocks (RFC 7440 §3). maxRequest bounds a request packet: RFC 2347 §2
// limits it to 512 octets; we accept a little more from lenient clients.
const (
	minBlockSize  = 8
	maxBlockSize  = 65464
	maxWindowSize = 65535
	maxRequest    = 1024
)

// errMalformed marks a packet that is not a well-formed request; it is
// dropped without an answer (it may not be TFTP at all).
var errMalformed = errors.New("malformed request")

// request is a parsed RRQ or WRQ (RFC 1350 §5) with the options we know
// (RFC 2347): zero means the client did not ask for that option.
type request struct {
	op       uint16
	filename string
	mode     string // lower case: "octet", "netascii" or "mail"
	// blksize (RFC 2348) and windowsize (RFC 7440) as requested, already
	// checked against their ranges; an out-of-range value is ignored as if
	// absent (RFC 2347 §2: the server may decline any option).
	blksize, windowsize int
	// tsize is set when the client sent the tsize option (RFC 2349 §3;
	// its value in a read request is 0 and carries no meaning).
	tsize bool
}

// parseRequest parses an RRQ or WRQ datagram. Option names and the mode are
// case-insensitive (RFC 1350 §5, RFC 2347 §2); unknown options are ignored,
// and a repeated option keeps its first value. Errors wrap errMalformed:
// short packet, another opcode, a field not terminated by NUL, an empty
// filename or mode, an option without a value, or a packet over maxRequest.
// On error, r.op is still the packet's opcode when it has one.
func parseRequest(p []byte) (request, error) {
	var r request
	if len(p) < 4 {
		return r, fmt.Errorf("%w: %d bytes", errMalformed, len(p))
	}
	if len(p) > maxRequest {
		return r, fmt.Errorf("%w: %d bytes", errMalformed, len(p))
	}
	r.op = binary.BigEndian.Uint16(p)
	if r.op != opRRQ && r.op != opWRQ {
		return r, fmt.Errorf("%w: opcode %d", errMalformed, r.op)
	}
	rest := p[2:]
	field := func() (string, bool) {
		i := bytes.IndexByte(rest, 0)
		if i < 0 {
			return "", false
		}
		s := string(rest[:i])
		rest = rest[i+1:]
		return s, true
	}
	var ok bool
	if r.filename, ok = field(); !ok || r.filename == "" {
		return r, fmt.Errorf("%w: filename", errMalformed)
	}
	mode, ok := field()
	if !ok || mode == "" {
		return r, fmt.Errorf("%w: mode", errMalformed)
	}
	r.mode = strings.ToLower(mode)
	seen := map[string]bool{}
	for len(rest) > 0 {
		name, ok := field()
		if !ok {
			return r, fmt.Errorf("%w: option name", errMalformed)
		}
		if name == "" {
			break // NUL padding after the last option, as some PXE ROMs send
		}
		val, ok := field()
		if !ok {
			return r, fmt.Errorf("%w: option %q has no value", errMalformed, name)
		}
		name = strings.ToLower(name)
		if seen[name] {
			continue
		}
		seen[name] = true
		switch name {
		case "blksize":
			if n, err := strconv.Atoi(val); err == nil && n >= minBlockSize && n <= maxBlockSize {
				r.blksize = n
			}
		case "windowsize":
			if n, err := strconv.Atoi(val); err == nil && n >= 1 && n <= maxWindowSize {
				r.windowsize = n
			}
		case "tsize":
			r.tsize = true
		}
	}
	return r, nil
}

// appendOption appends "name\0value\0" (RFC 2347 §2).
func appendOption(b []byte, name string, val int64) []byte {
	b = append(b, name...)
	b = append(b, 0)
	b = strconv.AppendInt(b, val, 10)
	return append(b, 0)
}

// errorPacket builds an ERROR packet (RFC 1350 §5) with code and msg.
func errorPacket(code uint16, msg string) []byte {
	b := make([]byte, 4, 5+len(msg))
	binary.BigEndian.PutUint16(b, opERROR)
	binary.BigEndian.PutUint16(b[2:], code)
	b = append(b, msg...)
	return append(b, 0)
}
