package state

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/machina-metal/machina/namerule"
)

// EventZoneClaim records a controller group's leader recording the zones
// its group claims (machina serve --group/--zones, docs/ha.md "Sharding").
const EventZoneClaim EventKind = "zone.claim"

// zoneClaimPrefix keys the claims in the meta bucket: "zoneclaim/" GROUP →
// ZoneClaim JSON.
var zoneClaimPrefix = []byte("zoneclaim/")

// ZoneClaim is one controller group's claim on zones of the inventory, as
// its leader last recorded it.
type ZoneClaim struct {
	Group string    `json:"group"`
	Zones []string  `json:"zones"`
	By    string    `json:"by,omitempty"` // the controller (--ha-id) that wrote it
	At    time.Time `json:"at"`
}

// PutZoneClaim records that group claims zones (sorted, deduplicated),
// replacing the group's previous claim, and writes an EventZoneClaim when
// it changed. Like every write it is fenced: a deposed leader's claim is
// refused. Errors: ErrInvalid for a group or zone that is not an RFC 1123
// label, or no zones.
func (s *Store) PutZoneClaim(group string, zones []string, by string) error {
	if !namerule.Label.Valid(group) {
		return fmt.Errorf("state: zone claim: group %q: want %s: %w", group, namerule.Label.What, ErrInvalid)
	}
	zs := slices.Clone(zones)
	slices.Sort(zs)
	zs = slices.Compact(zs)
	if len(zs) == 0 {
		return fmt.Errorf("state: zone claim of group %s: no zones: %w", group, ErrInvalid)
	}
	for _, z := range zs {
		if !namerule.Label.Valid(z) {
			return fmt.Errorf("state: zone claim of group %s: zone %q: want %s: %w", group, z, namerule.Label.What, ErrInvalid)
		}
	}
	return s.update(func(tx kvTx) error {
		meta := tx.Bucket(bucketMeta)
		key := append(append([]byte{}, zoneClaimPrefix...), group...)
		if old := meta.Get(key); old != nil {
			var c ZoneClaim
			if json.Unmarshal(old, &c) == nil && slices.Equal(c.Zones, zs) && c.By == by {
				return nil
			}
		}
		v, err := json.Marshal(ZoneClaim{Group: group, Zones: zs, By: by, At: time.Now().UTC()})
		if err != nil {
			return err
		}
		if err := meta.Put(key, v); err != nil {
			return err
		}
		return s.appendEvent(tx, &Event{Kind: EventZoneClaim, Actor: by,
			Message: "controller group " + group + " claims zones " + strings.Join(zs, ", ")})
	})
}

// DeleteZoneClaim removes group's claim (a group taken out of service,
// machina state zone-claims --delete); no claim is not an error.
func (s *Store) DeleteZoneClaim(group string) error {
	return s.update(func(tx kvTx) error {
		return tx.Bucket(bucketMeta).Delete(append(append([]byte{}, zoneClaimPrefix...), group...))
	})
}

// ZoneClaims returns every recorded claim, ordered by group.
func (s *Store) ZoneClaims() ([]ZoneClaim, error) {
	var out []ZoneClaim
	err := s.view(func(tx kvTx) error {
		c := tx.Bucket(bucketMeta).Cursor()
		for k, v := c.Seek(zoneClaimPrefix); k != nil && strings.HasPrefix(string(k), string(zoneClaimPrefix)); k, v = c.Next() {
			var zc ZoneClaim
			if err := json.Unmarshal(v, &zc); err != nil {
				return fmt.Errorf("zone claim %s: %w", k[len(zoneClaimPrefix):], err)
			}
			out = append(out, zc)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("state: zone claims: %w", err)
	}
	return out, nil
}

// ZoneClaimMap is ZoneClaims as group → zones (plan.Scope.Apply's
// input).
func (s *Store) ZoneClaimMap() (map[string][]string, error) {
	cs, err := s.ZoneClaims()
	if err != nil {
		return nil, err
	}
	m := make(map[string][]string, len(cs))
	for _, c := range cs {
		m[c.Group] = c.Zones
	}
	return m, nil
}
