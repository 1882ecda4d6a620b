package state

import (
	"errors"
	"fmt"
)

// Store errors callers branch on. Inspect them with errors.Is.
var (
	// ErrNotFound: the named server, token, secret or host does not exist.
	ErrNotFound = errors.New("not found")
	// ErrExists: a create named a record that already exists.
	ErrExists = errors.New("already exists")
	// ErrInvalid: an argument failed validation (a name, MAC or lifecycle).
	ErrInvalid = errors.New("invalid argument")
	// ErrLocked: another process holds the state file's lock (bbolt flock);
	// returned by Open after Options.Timeout.
	ErrLocked = errors.New("state file is locked by another process (is another machina running on it?)")
	// ErrSchemaVersion: the file was written by a newer Machina than this one.
	ErrSchemaVersion = errors.New("unsupported state schema version")
	// ErrClosed: the store was closed.
	ErrClosed = errors.New("store is closed")
	// ErrNoStateDir: Open's path is in a folder that does not exist. Open
	// never creates folders: a mistyped path must not silently start a new,
	// empty site somewhere else.
	ErrNoStateDir = errors.New("the state file's folder does not exist")
	// ErrNoStateFile: Options.MustExist was set and there is no state file
	// at the path (a command that manages an existing site).
	ErrNoStateFile = errors.New("no state file there")
)

// Lifecycle errors. A refused move returns a *TransitionError that wraps
// exactly one of these.
var (
	// ErrIllegalTransition: the move from→to is not in the lifecycle table.
	ErrIllegalTransition = errors.New("illegal lifecycle transition")
	// ErrStaleTransition: the move is legal but the server is no longer in
	// the expected from lifecycle (another caller moved it first).
	ErrStaleTransition = errors.New("stale lifecycle transition")
	// ErrLifecycleField: UpdateServer's function changed Lifecycle; use
	// Transition instead.
	ErrLifecycleField = errors.New("lifecycle may change only through Transition")
)

// Token errors, returned by ConsumeToken and AuthenticateAdmin. Each refusal
// of a machine token also writes an EventTokenRefused event.
var (
	// ErrTokenUnknown: no token with this value (never issued, revoked or
	// pruned after expiry).
	ErrTokenUnknown = errors.New("unknown token")
	// ErrTokenExpired: the token's ExpiresAt has passed.
	ErrTokenExpired = errors.New("token expired")
	// ErrTokenUsed: a single-use token was already consumed.
	ErrTokenUsed = errors.New("token already used")
	// ErrTokenMismatch: the token exists but was issued for another purpose,
	// server or MAC.
	ErrTokenMismatch = errors.New("token not valid for this request")
)

// Secret errors.
var (
	// ErrWrongMasterKey: the master key does not open this store's sealed
	// secrets (checked at Open against a sealed key-check record).
	ErrWrongMasterKey = errors.New("master key does not match the one this state file's secrets were sealed with")
	// ErrMasterKeyRequired: a sealed secret was read from a store opened
	// without a master key.
	ErrMasterKeyRequired = errors.New("secret is sealed and no master key is configured (set MACHINA_API_KEY_MASTER_KEY)")
)

// TransitionError reports a refused lifecycle move. It wraps
// ErrIllegalTransition or ErrStaleTransition; Current is the server's
// lifecycle when the move was refused (the API answers 409 with it).
type TransitionError struct {
	Server   string
	From, To Lifecycle
	Current  Lifecycle
	Err      error // ErrIllegalTransition or ErrStaleTransition
}

// Error names the refused move and the current lifecycle.
func (e *TransitionError) Error() string {
	return fmt.Sprintf("%v: server %s %s→%s (current %s)", e.Err, e.Server, e.From, e.To, e.Current)
}

// Unwrap returns ErrIllegalTransition or ErrStaleTransition.
func (e *TransitionError) Unwrap() error { return e.Err }
