package join

import (
	"fmt"
	"time"

	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/state"
	"sigs.k8s.io/yaml"
)

// HostStatus is the document the status writer commits as
// status/hosts/NAME.yaml: the host record, online or offline, and its join
// log (at most the last 50 entries).
type HostStatus struct {
	Name       string    `json:"name"`
	Server     string    `json:"server,omitempty"`
	Site       string    `json:"site,omitempty"`
	Rack       string    `json:"rack,omitempty"`
	Tags       []string  `json:"tags,omitempty"`
	Online     bool      `json:"online"`
	JoinStatus string    `json:"joinStatus,omitempty"`
	JoinReason string    `json:"joinReason,omitempty"`
	Networks   []string  `json:"networks,omitempty"`
	Pools      []string  `json:"storagePools,omitempty"`
	JoinedAt   time.Time `json:"joinedAt"`
	LastSeen   time.Time `json:"lastSeen,omitzero"`
	// BootedAt and AgentVersion come from the heartbeats.
	BootedAt     time.Time          `json:"bootedAt,omitzero"`
	AgentVersion string             `json:"agentVersion,omitempty"`
	Conditions   []v1.HostCondition `json:"conditions,omitempty"`
	JoinLog      []HostLogEntry     `json:"joinLog,omitempty"`
}

// HostLogEntry is one join-log line in HostStatus.
type HostLogEntry struct {
	At      time.Time `json:"at"`
	Level   string    `json:"level,omitempty"`
	Step    string    `json:"step,omitempty"`
	Message string    `json:"message"`
}

// HostStatusYAML renders h and its join log as status/hosts/NAME.yaml;
// heartbeat is the node heartbeat interval (zero means 30s). The output
// depends only on its inputs, so unchanged hosts give unchanged bytes
// except for Online flips.
func HostStatusYAML(h state.Host, log []state.JoinLogEntry, now time.Time, heartbeat time.Duration) ([]byte, error) {
	st := HostStatus{Name: h.Name, Server: h.Server, Site: h.Site, Rack: h.Rack, Tags: h.Tags,
		Online: Online(h, now, heartbeat), JoinStatus: h.JoinStatus, JoinReason: h.JoinReason,
		Networks: h.Networks, Pools: h.StoragePools, JoinedAt: h.JoinedAt, LastSeen: h.LastSeen.Truncate(time.Minute),
		BootedAt: h.BootedAt, AgentVersion: h.AgentVersion, Conditions: HostConditions(h)}
	st.Online = st.Online && h.Lost == nil
	if len(log) > 50 {
		log = log[len(log)-50:]
	}
	for _, e := range log {
		st.JoinLog = append(st.JoinLog, HostLogEntry{At: e.At, Level: e.Level, Step: e.Step, Message: e.Message})
	}
	out, err := yaml.Marshal(st)
	if err != nil {
		return nil, fmt.Errorf("join: host status %s: %w", h.Name, err)
	}
	return out, nil
}
