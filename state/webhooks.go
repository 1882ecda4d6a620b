package state

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
)

// EventWebhookDropped records that events were evicted from the log
// (Retention) before an outgoing webhook delivered them: Message names the
// webhook and how many Seqs it skipped.
const EventWebhookDropped EventKind = "webhook.dropped"

var webhookCursorPrefix = []byte("webhook-cursor/")

// webhookKey is the meta key of webhook name's delivery cursor: a digest
// of the name, so any name (a URL) is a short, engine-neutral key.
func webhookKey(name string) []byte {
	sum := sha256.Sum256([]byte(name))
	return append(append([]byte{}, webhookCursorPrefix...), hex.EncodeToString(sum[:16])...)
}

// WebhookCursor returns the delivery cursor of the outgoing webhook name:
// the Seq of the last event delivered (or skipped) to it. A webhook
// without a cursor gets one at LastEventSeq, in the same transaction, so a
// newly configured webhook receives the events appended from then on,
// not the whole retained log.
func (s *Store) WebhookCursor(name string) (uint64, error) {
	var seq uint64
	err := s.update(func(tx kvTx) error {
		meta := tx.Bucket(bucketMeta)
		key := webhookKey(name)
		if v := meta.Get(key); v != nil {
			seq = btoi(v)
			return nil
		}
		seq = tx.Bucket(bucketEvents).Sequence()
		return meta.Put(key, u64(seq))
	})
	if err != nil {
		return 0, fmt.Errorf("state: webhook cursor %q: %w", name, err)
	}
	return seq, nil
}

// SetWebhookCursor moves webhook name's delivery cursor forward to seq (a
// seq at or below the stored cursor leaves it unchanged). dropped > 0
// says that many Seqs up to seq were evicted before delivery: an
// EventWebhookDropped is appended in the same transaction, so a drop is
// recorded once, with the cursor move that passes it.
func (s *Store) SetWebhookCursor(name string, seq, dropped uint64) error {
	err := s.update(func(tx kvTx) error {
		meta := tx.Bucket(bucketMeta)
		key := webhookKey(name)
		if v := meta.Get(key); v != nil && btoi(v) >= seq {
			return nil
		}
		if err := meta.Put(key, u64(seq)); err != nil {
			return err
		}
		if dropped == 0 {
			return nil
		}
		return s.appendEvent(tx, &Event{Kind: EventWebhookDropped, Actor: ActorController,
			Message: fmt.Sprintf("webhook %s: %d events evicted from the log before delivery (up to seq %d)", name, dropped, seq)})
	})
	if err != nil {
		return fmt.Errorf("state: set webhook cursor %q: %w", name, err)
	}
	return nil
}
