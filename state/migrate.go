package state

import (
	"encoding/json"
	"fmt"
	"time"
)

// migrate1to2 rewrites version-1 server records, whose "power" was a bare
// string and which had no power source or time, into version-2 records
// with a PowerStatus. The hosts, join-log and admin-token buckets are
// created by Open after the migrations run.
func migrate1to2(tx kvTx) error {
	b := tx.Bucket(bucketServers)
	if b == nil {
		return nil
	}
	type kv struct{ k, v []byte }
	var rewrites []kv
	err := b.ForEach(func(k, v []byte) error {
		var rec map[string]json.RawMessage
		if err := json.Unmarshal(v, &rec); err != nil {
			return fmt.Errorf("decode v1 server %s: %w", k, err)
		}
		var power string
		if raw, ok := rec["power"]; ok {
			if err := json.Unmarshal(raw, &power); err != nil {
				return fmt.Errorf("decode v1 server %s power: %w", k, err)
			}
		}
		if !Power(power).Valid() {
			power = string(PowerRegistered)
		}
		var at time.Time
		if raw, ok := rec["updatedAt"]; ok {
			_ = json.Unmarshal(raw, &at) // a missing or bad time stays zero
		}
		ps, err := json.Marshal(PowerStatus{State: Power(power), At: at})
		if err != nil {
			return err
		}
		rec["power"] = ps
		if _, ok := rec["revision"]; !ok {
			rec["revision"] = json.RawMessage("1")
		}
		nv, err := json.Marshal(rec)
		if err != nil {
			return err
		}
		rewrites = append(rewrites, kv{append([]byte(nil), k...), nv})
		return nil
	})
	if err != nil {
		return err
	}
	for _, r := range rewrites {
		if err := b.Put(r.k, r.v); err != nil {
			return err
		}
	}
	return nil
}
