package ipmi

import (
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/bougou/go-ipmi/pkg/types"
)

// Security is what an RMCP+ session negotiated, as the BMC's RMCP+ Open
// Session Response stated it (IPMI v2.0 §13.17, table 13-10): the BMC may
// answer a request for one cipher suite with the algorithms of another
// (pyghmi's Bmc class, and so VirtualBMC, answers every request with
// suite 3's), and the session then runs with what it answered.
type Security struct {
	// Requested is the cipher suite the Open Session Request asked for.
	Requested uint8
	// Suite is the cipher suite (IPMI v2.0 table 22-20) whose algorithms
	// the BMC answered with; -1 when no suite has that combination.
	Suite int
	// Authentication, Integrity and Confidentiality are the algorithms'
	// names in the spec's terms (tables 13-17 to 13-19), e.g.
	// RAKP-HMAC-SHA1, HMAC-SHA1-96, AES-CBC-128.
	Authentication  string
	Integrity       string
	Confidentiality string
}

// String reads e.g. "cipher suite 3 (RAKP-HMAC-SHA1, HMAC-SHA1-96,
// AES-CBC-128)"; "" for the zero Security (no session yet).
func (s Security) String() string {
	if s.Authentication == "" {
		return ""
	}
	suite := "no cipher suite"
	if s.Suite >= 0 {
		suite = fmt.Sprintf("cipher suite %d", s.Suite)
	}
	return fmt.Sprintf("%s (%s, %s, %s)", suite, s.Authentication, s.Integrity, s.Confidentiality)
}

// SessionSecurity implements bmc.SecurityReporter: Security().String().
func (d *Driver) SessionSecurity() string { return d.Security().String() }

// Algorithm names, IPMI v2.0 tables 13-17 (authentication), 13-18
// (integrity) and 13-19 (confidentiality).
var (
	authNames  = map[uint8]string{0: "RAKP-none", 1: "RAKP-HMAC-SHA1", 2: "RAKP-HMAC-MD5", 3: "RAKP-HMAC-SHA256"}
	integNames = map[uint8]string{0: "none", 1: "HMAC-SHA1-96", 2: "HMAC-MD5-128", 3: "MD5-128", 4: "HMAC-SHA256-128"}
	cryptNames = map[uint8]string{0: "none", 1: "AES-CBC-128", 2: "xRC4-128", 3: "xRC4-40"}
)

func algName(m map[uint8]string, v uint8) string {
	if n, ok := m[v]; ok {
		return n
	}
	return fmt.Sprintf("0x%02X", v)
}

// suiteOf returns the cipher suite (0-19) with these algorithms, or -1.
func suiteOf(auth, integ, crypt uint8) int {
	for id := 0; id <= 19; id++ {
		a, i, c, ok := types.GetCipherSuiteAlgorithms(types.CipherSuiteID(id))
		if ok && uint8(a) == auth && uint8(i) == integ && uint8(c) == crypt {
			return id
		}
	}
	return -1
}

// suiteRank orders cipher suites by strength for the minimum: 17
// (SHA-256, AES) above 3 (SHA-1, AES) above every other suite (no
// integrity or no confidentiality, MD5, RC4), which no minimum admits.
func suiteRank(s int) int {
	switch s {
	case int(CipherSuite17):
		return 2
	case int(CipherSuite3):
		return 1
	}
	return 0
}

// openSessionSniffer is the dialer go-ipmi's client sends through
// (client.WithUDPProxy): a plain UDP socket whose reads are looked at for
// the RMCP+ Open Session Response, whose algorithms go-ipmi v0.9.1 adopts
// without exposing them.
type openSessionSniffer struct {
	timeout time.Duration

	mu   sync.Mutex
	seen bool
	// status is the response's status code (table 13-10 byte 2), auth,
	// integ and crypt its algorithms (valid when status is 0).
	status, auth, integ, crypt uint8
}

// Dial implements golang.org/x/net/proxy.Dialer.
func (s *openSessionSniffer) Dial(network, addr string) (net.Conn, error) {
	c, err := net.DialTimeout(network, addr, s.timeout)
	if err != nil {
		return nil, err
	}
	return &sniffConn{Conn: c, s: s}, nil
}

type sniffConn struct {
	net.Conn
	s *openSessionSniffer
}

func (c *sniffConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 {
		c.s.observe(b[:n])
	}
	return n, err
}

// observe parses an RMCP packet (RMCP header, IPMI v2.0 §13.1.3; RMCP+
// session header, §13.6, table 13-8) carrying an RMCP+ Open Session
// Response (payload type 11h, table 13-10).
func (s *openSessionSniffer) observe(p []byte) {
	const hdr = 4 + 12 // RMCP header; auth type, payload type, session ID, sequence, length
	if len(p) < hdr+2 || p[0] != 0x06 || p[4] != 0x06 || p[5]&0x3F != 0x11 {
		return
	}
	payload := p[hdr:]
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seen, s.status = true, payload[1]
	if s.status == 0 && len(payload) >= 36 {
		s.auth, s.integ, s.crypt = payload[16]&0x3F, payload[24]&0x3F, payload[32]&0x3F
	}
}

// security returns what the Open Session Response said; ok is false when
// none was read or it carried a non-zero status code.
func (s *openSessionSniffer) security(requested uint8) (Security, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.seen || s.status != 0 {
		return Security{Requested: requested, Suite: -1}, false
	}
	return Security{
		Requested: requested, Suite: suiteOf(s.auth, s.integ, s.crypt),
		Authentication: algName(authNames, s.auth), Integrity: algName(integNames, s.integ), Confidentiality: algName(cryptNames, s.crypt),
	}, true
}
