package ipmi

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"syscall"

	"github.com/bougou/go-ipmi/pkg/client"
	"github.com/bougou/go-ipmi/pkg/types"

	"github.com/machina-metal/machina/bmc"
)

// CompletionError is a non-zero IPMI completion code (IPMI v2.0 §5.2,
// table 5-2) returned for a command. It unwraps to a *bmc.BMCError (Code
// "0xD5", Message the code's meaning) whose Kind is the sentinel the code is
// classified as (see [ClassifyCompletionCode]), so both
// errors.As(err, new(*bmc.BMCError)) and errors.Is(err, bmc.ErrRefused) work.
type CompletionError struct {
	// Op names the operation, e.g. "chassis control cycle".
	Op string
	// Code is the completion code byte, e.g. 0xD5.
	Code uint8
}

func (e *CompletionError) Error() string {
	return fmt.Sprintf("ipmi: %s: completion code 0x%02X (%s)", e.Op, e.Code, ccText(e.Code))
}

// Unwrap returns the code as a *bmc.BMCError, which unwraps to the
// classified sentinel (nil Kind when the code is not classified).
func (e *CompletionError) Unwrap() error {
	return &bmc.BMCError{Op: e.Op, Code: fmt.Sprintf("0x%02X", e.Code), Message: ccText(e.Code), Kind: ClassifyCompletionCode(e.Code)}
}

// ClassifyCompletionCode maps an IPMI completion code to a bmc sentinel:
//
//	0xC0 node busy, 0xC3 timeout, 0xCE cannot respond, 0xD0-0xD2 busy updating → bmc.ErrTransient
//	0xD5 not supported in present state                           → bmc.ErrRefused
//	0xC1 invalid command, 0xCC invalid data, 0xC9 out of range,
//	0xD6 sub-function disabled, 0x80 parameter not supported       → bmc.ErrUnsupported
//	0xD4 insufficient privilege                                    → bmc.ErrAuth
//
// Any other code returns nil (unknown).
func ClassifyCompletionCode(cc uint8) error {
	switch cc {
	case 0xC0, 0xC3, 0xCE, 0xD0, 0xD1, 0xD2:
		return bmc.ErrTransient
	case 0xD5:
		return bmc.ErrRefused
	case 0xC1, 0xCC, 0xC9, 0xD6, 0x80:
		return bmc.ErrUnsupported
	case 0xD4:
		return bmc.ErrAuth
	}
	return nil
}

func ccText(cc uint8) string {
	switch cc {
	case 0x80:
		return "parameter not supported"
	case 0xC0:
		return "node busy"
	case 0xC1:
		return "invalid command"
	case 0xC3:
		return "timeout"
	case 0xC7:
		return "request data length invalid"
	case 0xC9:
		return "parameter out of range"
	case 0xCC:
		return "invalid data field in request"
	case 0xCE:
		return "cannot provide response"
	case 0xD4:
		return "insufficient privilege"
	case 0xD5:
		return "not supported in present state"
	case 0xD6:
		return "sub-function disabled or unavailable"
	case 0xFF:
		return "unspecified error"
	}
	return "see IPMI v2.0 table 5-2"
}

// classify turns an error from go-ipmi into one wrapping a bmc sentinel.
// op names the operation for the message. Passwords never appear in go-ipmi
// errors, so the text is kept.
func classify(op string, err error) error {
	if err == nil {
		return nil
	}
	var ce *CompletionError
	if errors.As(err, &ce) {
		return err
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("ipmi: %s: %w", op, err)
	}
	if re, ok := types.IsResponseError(err); ok && re.CompletionCode() != 0 {
		return &CompletionError{Op: op, Code: uint8(re.CompletionCode())}
	}
	if isAuthError(err) {
		return fmt.Errorf("ipmi: %s: %w: %v", op, bmc.ErrAuth, err)
	}
	if isTimeout(err) || isRefused(err) {
		return fmt.Errorf("ipmi: %s: %w: %v", op, bmc.ErrUnreachable, err)
	}
	return fmt.Errorf("ipmi: %s: %w", op, err)
}

// isAuthError reports a RAKP authentication failure (wrong password) or an
// RMCP+ status the BMC uses to refuse the user (IPMI v2.0 table 13-15).
func isAuthError(err error) bool {
	if errors.Is(err, client.ErrRAKPAuthentication) {
		return true
	}
	authCodes := []types.RmcpStatusCode{types.RmcpStatusCodeUnauthorizedName, types.RmcpStatusCodeInvalidRole,
		types.RmcpStatusCodeUnauthorizedRoleOfPriLevel, types.RmcpStatusCodeInvalidIntegrityCheckValue,
		types.RmcpStatusCodeInvalidNameLength}
	var rs *types.RmcpStatusError
	if errors.As(err, &rs) {
		return slices.Contains(authCodes, rs.StatusCode())
	}
	// go-ipmi v0.9.1 Connect20 formats its per-suite errors with %v, which
	// drops the error chain: match the texts of ErrRAKPAuthentication and
	// types.RmcpStatusError ("RMCP+ status 0x0d: ...").
	s := err.Error()
	if strings.Contains(s, client.ErrRAKPAuthentication.Error()) {
		return true
	}
	for _, c := range authCodes {
		if strings.Contains(s, fmt.Sprintf("RMCP+ status %#02x", uint8(c))) {
			return true
		}
	}
	return false
}

// rakp1Silent reports that at least one cipher suite got as far as RAKP
// Message 1 (the BMC answered Get Channel Authentication Capabilities and
// accepted the RMCP+ Open Session Request) and then no answer came, and
// that no suite met silence at an earlier step (the others were refused
// outright). RAKP Message 1 is the first message that carries the user
// name (IPMI v2.0 section 13.20); a BMC that knows the name answers RAKP
// Message 2, and one that does not should answer it with status 0Dh
// (unauthorized name), but some stay silent instead (pyghmi's BMC, so
// virtualbmc, drops RAKP 1 for a user it does not know). A BMC that
// answers up to that step is not unreachable.
func rakp1Silent(errs []error) bool {
	silent := false
	for _, e := range errs {
		switch {
		case isTimeout(e) && strings.Contains(e.Error(), "rakp1 failed"):
			silent = true
		case isTimeout(e):
			return false
		}
	}
	return silent
}

// unknownUserError is the bmc.ErrAuth error for a BMC that went silent at
// RAKP Message 1 under every cipher suite: it names the user, never the
// password.
func unknownUserError(user string, suites []uint8) error {
	return fmt.Errorf("ipmi: open session as user %q: %w: the BMC accepted the session (cipher suites tried: %v) and then went silent at RAKP Message 1, which is how some BMCs refuse a user name they do not know; check the user name", user, bmc.ErrAuth, suites)
}

// isTimeout reports that no answer arrived: a UDP read deadline, or
// go-ipmi's "no datagram matched" after all retransmissions.
func isTimeout(err error) bool {
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return true
	}
	return strings.Contains(err.Error(), "no datagram matched") || strings.Contains(err.Error(), "timed out")
}

// isRefused reports an ICMP port unreachable (nothing listens on the port).
func isRefused(err error) bool {
	return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.EHOSTUNREACH) || errors.Is(err, syscall.ENETUNREACH)
}

func containsAll(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}
