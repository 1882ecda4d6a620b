package state

import (
	"fmt"
	"strings"
)

// EventApproval records an operator approving a revision the safety brake held.
const EventApproval EventKind = "approval"

var approvalPrefix = []byte("approval/")

// Approve records that actor approved the held plan of the inventory
// revision whose digest starts with prefix (at least 12 hex digits, as
// `machinactl approve` shows it), and writes an EventApproval in the same
// transaction. Approving twice is a no-op that still succeeds.
// Errors: ErrInvalid for a prefix that is not 12 to 64 lower-case hex digits.
func (s *Store) Approve(prefix, actor string) error {
	prefix = strings.TrimPrefix(prefix, "sha256:")
	if len(prefix) < 12 || len(prefix) > 64 || strings.Trim(prefix, "0123456789abcdef") != "" {
		return fmt.Errorf("state: approve %q: want 12 to 64 lower-case hex digits of an inventory digest: %w", prefix, ErrInvalid)
	}
	if actor == "" {
		actor = ActorLocal
	}
	return s.update(func(tx kvTx) error {
		meta := tx.Bucket(bucketMeta)
		key := append(append([]byte{}, approvalPrefix...), prefix...)
		if meta.Get(key) != nil {
			return nil
		}
		if err := meta.Put(key, []byte(actor)); err != nil {
			return err
		}
		return s.appendEvent(tx, &Event{Kind: EventApproval, Actor: actor, Message: "approved held plan of inventory " + prefix})
	})
}

// Approved reports whether the revision with this full digest
// ("sha256:..." or bare hex) was approved under any prefix of it.
func (s *Store) Approved(digest string) (bool, error) {
	digest = strings.TrimPrefix(digest, "sha256:")
	found := false
	err := s.view(func(tx kvTx) error {
		c := tx.Bucket(bucketMeta).Cursor()
		for k, _ := c.Seek(approvalPrefix); k != nil && strings.HasPrefix(string(k), string(approvalPrefix)); k, _ = c.Next() {
			if strings.HasPrefix(digest, string(k[len(approvalPrefix):])) {
				found = true
				return nil
			}
		}
		return nil
	})
	return found, err
}

// Approval is a recorded approval: the digest prefix (hex) and who
// approved it (an admin token's name, or ActorLocal).
type Approval struct {
	Revision string `json:"revision"`
	Actor    string `json:"actor"`
}

// Approvals returns every recorded approval, ordered by prefix.
func (s *Store) Approvals() ([]Approval, error) {
	var out []Approval
	err := s.view(func(tx kvTx) error {
		c := tx.Bucket(bucketMeta).Cursor()
		for k, v := c.Seek(approvalPrefix); k != nil && strings.HasPrefix(string(k), string(approvalPrefix)); k, v = c.Next() {
			out = append(out, Approval{Revision: string(k[len(approvalPrefix):]), Actor: string(v)})
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("state: approvals: %w", err)
	}
	return out, nil
}
