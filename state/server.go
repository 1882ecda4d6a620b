package state

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"time"

	"github.com/machina-metal/machina/macaddr"
)

// Server is one machine's observed state. Name is the key; everything else
// is what Machina last saw or did.
type Server struct {
	Name    string `json:"name"`              // RFC 1123 label, unique
	Zone    string `json:"zone,omitempty"`    // copied from the inventory for filtering
	Site    string `json:"site,omitempty"`    // copied from the inventory
	Rack    string `json:"rack,omitempty"`    // copied from the inventory
	BootMAC string `json:"bootMAC,omitempty"` // lower-case colon form
	// BootMode is the firmware interface from the inventory: "uefi" or "bios".
	BootMode string `json:"bootMode,omitempty"`

	Lifecycle   Lifecycle   `json:"lifecycle"`
	LifecycleAt time.Time   `json:"lifecycleAt"` // time of the last lifecycle move (UTC)
	Power       PowerStatus `json:"power"`

	BMC      BMCFacts  `json:"bmc"`
	Hardware *Hardware `json:"hardware,omitempty"` // nil until commissioned
	// Firmware is the BMC's firmware read (BIOS and registry, storage,
	// firmware inventory, Secure Boot); nil until read.
	Firmware   *Firmware        `json:"firmware,omitempty"`
	Allocation *Allocation      `json:"allocation,omitempty"` // nil unless allocated or deployed
	Actions    map[string]int64 `json:"actions,omitempty"`    // observed action counters (commission, powerCycle, ...)
	LastError  string           `json:"lastError,omitempty"`  // sanitised; never a secret

	// Addresses are the pool addresses IPAM holds for this server
	// (ipam.go): taken with its allocation, kept through a release on a
	// subnet whose release policy is keep. Sorted by subnet, interface,
	// address.
	Addresses []AddressLease `json:"addresses,omitempty"`

	// InFlight is the action the controller started and has not finished
	// (the action journal): a controller that stops mid-action finds it on
	// start and resumes or fails it cleanly. Nil when idle.
	InFlight *InFlight `json:"inFlight,omitempty"`
	// Stalled holds the key of a disruptive action that failed and is not
	// retried until the desired state or counter changes; "" when not stalled.
	Stalled string `json:"stalled,omitempty"`
	// Failures counts the controller's consecutive failed steps on this
	// server and RetryAt is when it may try again (the backoff after the
	// last failure); both are written with LastError and the failure's
	// event in one transaction (UpdateServerWithEvent) and cleared by the
	// next step that succeeds, so backoff survives a restart.
	Failures int       `json:"failures,omitempty"`
	RetryAt  time.Time `json:"retryAt,omitzero"`
	// NeedsWipe is set on release: the ramdisk wipes the disk's partition
	// tables and signatures before the server is reused.
	NeedsWipe bool `json:"needsWipe,omitempty"`
	// WipeStartedAt is when the controller PXE-booted the released server
	// into the ramdisk's wipe mode; zero when no wipe is running.
	WipeStartedAt time.Time `json:"wipeStartedAt,omitzero"`
	// WipeFailures counts wipes that failed (reported failure or no report
	// within the wipe deadline) since the last good one; WipeFailedAt is the
	// last failure. The plan retries after a doubling delay.
	WipeFailures int       `json:"wipeFailures,omitempty"`
	WipeFailedAt time.Time `json:"wipeFailedAt,omitzero"`
	// WipeErase is the erase method of the release wipe (the released
	// allocation's Erase; "" means metadata). WipeUnsupported says the last
	// failure was a disk that cannot do it (LastError names the disk and
	// why). LastErase is each disk's outcome of the last erase reported.
	WipeErase string `json:"wipeErase,omitempty"`
	// WipeEraseDisks is the release wipe's method per disk (the released
	// allocation's EraseDisks); empty when every disk takes WipeErase.
	WipeEraseDisks  []EraseDisk `json:"wipeEraseDisks,omitempty"`
	WipeUnsupported bool        `json:"wipeUnsupported,omitempty"`
	LastErase       []DiskErase `json:"lastErase,omitempty"`
	// FinishDeploy is set when the ramdisk reported a good deploy: the
	// executor still has to set the boot override to disk (read back).
	FinishDeploy bool `json:"finishDeploy,omitempty"`
	// Health is the BMC's health rollup ("OK", "Warning", "Critical"), "" when unknown.
	Health string `json:"health,omitempty"`
	// BMCError is why the controller's last BMC sweep could not read this
	// server's BMC (refused login, unreachable), "" when it could
	// (ObserveBMC clears it; BMCReadFailed sets it).
	BMCError string `json:"bmcError,omitempty"`
	// Enrolled is set on a server that enrolled itself by PXE-booting with
	// a MAC no server had (auto-enrol, MACHINA_METAL_AUTO_ENROLL=1); nil for
	// servers registered from servers.yaml. It stays set once the server is
	// in servers.yaml, as its history.
	Enrolled *Enrolment `json:"enrolled,omitempty"`
	// TPM is the server's attested TPM 2.0 (EK fingerprint), nil before
	// a verified attestation or a refused one.
	TPM *TPM `json:"tpm,omitempty"`
	// Fenced is set when the server was fenced (FenceServer): the
	// reconciler never powers it on until an operator clears it
	// (UnfenceServer). Nil when not fenced.
	Fenced *Fencing `json:"fenced,omitempty"`

	// Deploy is what the controller planned for the running (or last)
	// image deploy and whether the ramdisk's done matched it; nil before
	// a plan was served.
	Deploy *DeployRecord `json:"deploy,omitempty"`
	// LastHeard says what the machine last did that the controller saw
	// (script fetched, plan fetched, report, done), LastHeardAt when (UTC);
	// the plan re-netboots a commissioning or deploying server silent too
	// long (Renetboots counts those since the phase began).
	LastHeard   string    `json:"lastHeard,omitempty"`
	LastHeardAt time.Time `json:"lastHeardAt,omitzero"`
	// BootFetch is the last boot file (kernel or initrd) the network boot
	// servers sent this server's machine, nil before one (NoteBootFetch).
	// A fetch is also noted as LastHeard; while BootFetch.At equals
	// LastHeardAt nothing was heard from the machine since, and the plan
	// reports a silent machine as BootStalled (its boot chain got the
	// kernel, the ramdisk never called).
	BootFetch   *BootFetch `json:"bootFetch,omitempty"`
	Renetboots  int        `json:"renetboots,omitempty"`
	RenetbootAt time.Time  `json:"renetbootAt,omitzero"`
	// Progress is the ramdisk's latest progress report of a long step
	// (the image's download, write or read-back); nil before one. It is
	// kept after the step as the last one seen; Progress.At before
	// LifecycleAt or RenetbootAt is from an earlier boot.
	Progress *Progress `json:"progress,omitempty"`

	// Revision increases by one on every committed change of this record.
	Revision  uint64    `json:"revision"`
	CreatedAt time.Time `json:"createdAt"`
	UpdatedAt time.Time `json:"updatedAt"`
}

// BootFetch is a boot file the network boot servers sent a machine.
type BootFetch struct {
	// File is the name the machine asked for, e.g.
	// "machina/ramdisk/vmlinuz".
	File string `json:"file"`
	// Via is the protocol: "tftp" or "http".
	Via string `json:"via"`
	// SecureBoot is set when the machine was booting the Secure Boot
	// chain (shim, GRUB, a kernel shim must verify).
	SecureBoot bool `json:"secureBoot,omitempty"`
	// At is when the transfer ended (UTC).
	At time.Time `json:"at"`
}

// BMCFacts is what Machina knows about a server's BMC. Credentials is the
// name of a secret in the store, never a password.
type BMCFacts struct {
	Driver          string `json:"driver,omitempty"`  // redfish | ipmi
	Address         string `json:"address,omitempty"` // Redfish URL or IPMI host[:port]
	Credentials     string `json:"credentials,omitempty"`
	SystemID        string `json:"systemID,omitempty"`    // Redfish ComputerSystem Id on multi-system BMCs
	InsecureTLS     bool   `json:"insecureTLS,omitempty"` // Redfish: skip TLS verification (inventory opt-out)
	Manufacturer    string `json:"manufacturer,omitempty"`
	Model           string `json:"model,omitempty"`
	SerialNumber    string `json:"serialNumber,omitempty"`
	FirmwareVersion string `json:"firmwareVersion,omitempty"`
	Auth            string `json:"auth,omitempty"`     // Redfish: "", auto, session or basic (inventory bmc.auth)
	CABundle        string `json:"caBundle,omitempty"` // Redfish: secret name of the PEM CA bundle (inventory bmc.caBundle)
	// MinCipherSuite is IPMI only: the weakest cipher suite this BMC's
	// sessions may run with (inventory bmc.minCipherSuite, 3 or 17); 0
	// uses the controller's.
	MinCipherSuite uint8 `json:"minCipherSuite,omitempty"`
	// Security is what the last BMC session negotiated, as the BMC
	// answered (IPMI: "cipher suite 3 (RAKP-HMAC-SHA1, HMAC-SHA1-96,
	// AES-CBC-128)", bmc.SecurityReporter); "" when not known.
	Security string `json:"security,omitempty"`
	// OnceNotHonoured is learned from the BMC: it did not honour a
	// one-time boot override (coerced it to Continuous or ignored it), so
	// netboots ask for Continuous at once and set disk back afterwards.
	OnceNotHonoured bool `json:"onceNotHonoured,omitempty"`
	// RestoreDisk is set while a persistent network-boot override the
	// controller had to use is in place: after the boot it was for
	// (commissioning report, deploy, wipe) the executor sets disk back.
	RestoreDisk bool `json:"restoreDisk,omitempty"`
	// ResetUnverified is why the last reset or cycle the controller sent
	// was not proven (the BMC offered no evidence), "" after a verified one.
	ResetUnverified string `json:"resetUnverified,omitempty"`
	// Quirks are the boot-override quirks learned from this BMC by reading
	// overrides back (bmc.BootQuirk names: bootFlagsNotPersistent,
	// bootModeIgnored, bootDeviceAtPowerOn), sorted, each once. Status
	// shows them as bmcQuirks.
	Quirks []string `json:"quirks,omitempty"`
}

// Enrolment records how an auto-enrolled server came in and where its
// proposed servers.yaml entry went. Times are UTC.
type Enrolment struct {
	// At is when the boot servers first saw the MAC.
	At time.Time `json:"at"`
	// Source is the boot server that saw it: "dhcp" or "ipxe".
	Source string `json:"source,omitempty"`
	// Branch and Commit locate the proposal in the inventory repository;
	// both "" until it is pushed.
	Branch string `json:"branch,omitempty"`
	Commit string `json:"commit,omitempty"`
	// ProposedAt is when the proposal was pushed; zero until then.
	ProposedAt time.Time `json:"proposedAt,omitzero"`
	// ProposalError is the last failed proposal attempt (sanitised), ""
	// after a success.
	ProposalError string `json:"proposalError,omitempty"`
}

// Hardware is the commissioning report's summary.
type Hardware struct {
	Cores       int       `json:"cores"`
	MemoryBytes int64     `json:"memoryBytes"`
	Disks       []Disk    `json:"disks,omitempty"`
	NICs        []NIC     `json:"nics,omitempty"`
	Vendor      string    `json:"vendor,omitempty"`
	Product     string    `json:"product,omitempty"`
	Serial      string    `json:"serial,omitempty"`
	ObservedAt  time.Time `json:"observedAt"`
	// CPUVendor is cpuinfo's vendor_id ("GenuineIntel"); Arch a GOARCH
	// name ("amd64"), the running kernel's; InstalledMemoryBytes the DIMM
	// total (0 without DMI); GPUs the display controllers. All empty from
	// older reports.
	CPUVendor string `json:"cpuVendor,omitempty"`
	Arch      string `json:"arch,omitempty"`
	// SMBIOSArch is the GOARCH name the firmware's SMBIOS tables state
	// (api/v1.CPU.SMBIOSArch: type 44, else type 4), "" when they state
	// none or the report predates the field. [Hardware.MachineArch] and
	// [Hardware.ArchConflict] weigh it against Arch.
	SMBIOSArch           string `json:"smbiosArch,omitempty"`
	InstalledMemoryBytes int64  `json:"installedMemoryBytes,omitempty"`
	GPUs                 []GPU  `json:"gpus,omitempty"`
}

// GPU is one display controller from the commissioning report.
type GPU struct {
	PCIAddress string `json:"pciAddress,omitempty"`
	Vendor     string `json:"vendor"` // nvidia, amd, intel or the PCI vendor id
	DeviceID   string `json:"deviceID,omitempty"`
}

// Disk is one block device from the commissioning report.
type Disk struct {
	Name       string `json:"name"` // kernel name, e.g. nvme0n1
	SizeBytes  int64  `json:"sizeBytes"`
	Model      string `json:"model,omitempty"`
	Serial     string `json:"serial,omitempty"`
	Rotational bool   `json:"rotational,omitempty"`
	// Transport is "nvme", "sata", "sas", "usb", "virtio", "scsi" or "".
	Transport string `json:"transport,omitempty"`
	// WWN and ByPath are the disk's stable identities from the report
	// (api/v1 Disk): a profile's storage layout chooses disks by them.
	WWN    string `json:"wwn,omitempty"`
	ByPath string `json:"byPath,omitempty"`
}

// NIC is one network interface from the commissioning report.
type NIC struct {
	Name      string `json:"name"`
	MAC       string `json:"mac"` // lower-case colon form
	SpeedMbps int    `json:"speedMbps,omitempty"`
	Link      bool   `json:"link,omitempty"`
	// LLDP is what the NIC heard from its switch port at commissioning;
	// nil when it heard nothing.
	LLDP *LLDP `json:"lldp,omitempty"`
	// Driver is the kernel driver and PCIAddress the PCI function
	// ("0000:3b:00.0"); both "" from reports that predate them.
	Driver     string `json:"driver,omitempty"`
	PCIAddress string `json:"pciAddress,omitempty"`
}

// Allocation records the profile a server was allocated to.
type Allocation struct {
	Profile string    `json:"profile"`
	Image   string    `json:"image,omitempty"`
	At      time.Time `json:"at"`
	// Reason says why: "pinned" (want: deployed), "count" (a profile's
	// count) or "provision" (the provision API).
	Reason string `json:"reason,omitempty"`
	// Deploy is the profile's deploy method at allocation: "" or "image"
	// (the ramdisk writes Image), "autoinstall" or "kickstart" (the
	// distribution installer booted from Image, an installer ISO).
	Deploy string `json:"deploy,omitempty"`
	// Erase is the profile's erase method at allocation (api/v1
	// EraseMetadata, ...; "" means metadata); a release copies it to
	// Server.WipeErase.
	Erase string `json:"erase,omitempty"`
	// EraseDisks is the release erase method of each commissioned disk,
	// chosen at allocation from the profile's erase and eraseOverrides
	// (inventory.PlanErase); empty when the profile has no overrides and
	// every disk takes Erase. A release copies it to
	// Server.WipeEraseDisks.
	EraseDisks []EraseDisk `json:"eraseDisks,omitempty"`
	// PlanServedAt is when the ramdisk was served its deploy plan, i.e.
	// when the image write starts; zero until then. Before it, a change of
	// the profile's image re-plans the deploy with the new image (Image is
	// rewritten when the plan is served); from it on, Image is fixed for
	// this deploy and a changed profile image applies on the next
	// redeploy.
	PlanServedAt time.Time `json:"planServedAt,omitzero"`
}

// EraseMethod returns the allocation's Erase; "" for a nil allocation.
func (a *Allocation) EraseMethod() string {
	if a == nil {
		return ""
	}
	return a.Erase
}

// EraseDiskMethods returns the allocation's EraseDisks; nil for a nil
// allocation.
func (a *Allocation) EraseDiskMethods() []EraseDisk {
	if a == nil {
		return nil
	}
	return a.EraseDisks
}

// EraseDisk is one disk's planned release erase method: the disk as
// commissioning reported it (its by-path, WWN or serial find it in the
// ramdisk; Name and SizeBytes are for messages and the size check) and
// the method (api/v1 EraseMetadata, EraseDiscard, EraseZero or
// EraseSecure).
type EraseDisk struct {
	Name      string `json:"name,omitempty"`
	ByPath    string `json:"byPath,omitempty"`
	WWN       string `json:"wwn,omitempty"`
	Serial    string `json:"serial,omitempty"`
	SizeBytes int64  `json:"sizeBytes,omitempty"`
	Method    string `json:"method"`
}

// DeployRecord is one image deploy as planned and as verified.
type DeployRecord struct {
	// ID is the deploy plan token's ID (12 hex digits): it names this
	// deploy, and the join token of the host is bound to it.
	ID string `json:"id"`
	// ImageSHA256 and ImageSizeBytes are the plan's raw image digest and
	// size; ReadBack is whether the plan asked for a read-back digest.
	ImageSHA256    string    `json:"imageSHA256"`
	ImageSizeBytes int64     `json:"imageSizeBytes"`
	ReadBack       bool      `json:"readBack,omitempty"`
	PlannedAt      time.Time `json:"plannedAt"`
	// Verified is set when the ramdisk's done carried the plan's digest,
	// size and read-back digest; VerifiedAt is when.
	Verified   bool      `json:"verified,omitempty"`
	VerifiedAt time.Time `json:"verifiedAt,omitzero"`
}

// DiskErase is one disk's erase outcome (api/v1.DiskErase): the disk's
// stable identity and kernel name, the method that ran, the bytes erased, the wall time and the samples verified.
type DiskErase struct {
	Disk            string        `json:"disk"`
	Name            string        `json:"name,omitempty"`
	Method          string        `json:"method"`
	Bytes           int64         `json:"bytes"`
	Duration        time.Duration `json:"durationNs"`
	VerifiedSamples int           `json:"verifiedSamples,omitempty"`
}

// Progress is how far a machine's long step is, as its ramdisk last
// reported it (api/v1.Progress).
type Progress struct {
	// Step names the step (api/v1.StepImageDownload, ...).
	Step string `json:"step"`
	// BytesDone of BytesTotal bytes are done; RateBytesPerSecond is the
	// rate the machine measured over its last interval.
	BytesDone          int64 `json:"bytesDone"`
	BytesTotal         int64 `json:"bytesTotal"`
	RateBytesPerSecond int64 `json:"rateBytesPerSecond"`
	// Retry is the agent's failing request it is asking again, and why
	// (api/v1.Progress.Retry); "" while the bytes move.
	Retry string `json:"retry,omitempty"`
	// At is when the controller took the report (UTC); AdvancedAt is when
	// a report last moved the step or its bytes forward. A machine that
	// keeps reporting the same bytes has an At that moves and an
	// AdvancedAt that does not: it is stalled, and only an advance counts
	// as hearing from it (LastHeardAt).
	At         time.Time `json:"at"`
	AdvancedAt time.Time `json:"advancedAt,omitzero"`
}

// Wiping reports whether the server's release wipe is running (ready,
// NeedsWipe, WipeStartedAt set).
func (s Server) Wiping() bool {
	return s.Lifecycle == LifecycleReady && s.NeedsWipe && !s.WipeStartedAt.IsZero()
}

// CurrentProgress returns the server's progress report when it is of the
// running deploy (the server is deploying and the report was taken since
// the phase began and since the last re-netboot) or of the running release
// wipe's erase (taken since the wipe started). Otherwise nil.
func (s Server) CurrentProgress() *Progress {
	p := s.Progress
	if p != nil && s.Wiping() && !p.At.Before(s.WipeStartedAt) {
		return p
	}
	if p == nil || s.Lifecycle != LifecycleDeploying || p.At.Before(s.LifecycleAt) || p.At.Before(s.RenetbootAt) {
		return nil
	}
	return p
}

// InFlight is one started action of the reconciler's executor.
type InFlight struct {
	Action  string    `json:"action"`            // reconciler action name, e.g. "commission"
	Key     string    `json:"key"`               // identifies the desired state the action serves
	Started time.Time `json:"started"`           // when it started (UTC)
	Attempt int       `json:"attempt"`           // 1 for the first try
	Counter int64     `json:"counter,omitempty"` // desired action counter it satisfies, if any
	// PowerSent is when this entry's power action (the netboot's power on
	// or reset) was sent to the BMC; zero before. It is written before the
	// request goes out, so a controller that resumes the entry (after a
	// crash, or a new leader after a failover) knows the BMC may already
	// have acted, reads it back and does not repeat a reset. Kept across
	// attempts of the same Key.
	PowerSent time.Time `json:"powerSent,omitzero"`
	// ResetMark is the BMC's last reset time (Redfish
	// ComputerSystem.LastResetTime, in the BMC's clock) read just before
	// this entry's reset or power cycle went out; zero when the BMC reports
	// none or the entry sends no reset. A resumed entry whose BMC now
	// reports another time knows the reset happened. Kept with PowerSent.
	ResetMark time.Time `json:"resetMark,omitzero"`
}

var nameRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)

// ValidName reports whether s is an RFC 1123 label (lower case, 1–63
// characters, letters, digits and inner hyphens): the rule for server,
// host, secret and admin-token names.
func ValidName(s string) bool { return nameRE.MatchString(s) }

func checkName(kind, s string) error {
	if !ValidName(s) {
		return fmt.Errorf("%s name %q is not an RFC 1123 label: %w", kind, s, ErrInvalid)
	}
	return nil
}

// normalizeMAC returns mac in canonical form ([macaddr.Normalize]: any
// notation, 48-bit only), or an error wrapping ErrInvalid.
func normalizeMAC(mac string) (string, error) {
	m, err := macaddr.Normalize(mac)
	if err != nil {
		return "", fmt.Errorf("mac %q: %w", mac, ErrInvalid)
	}
	return m, nil
}

// CreateServer adds a server. An empty Lifecycle means LifecycleNew; an
// empty Power.State means PowerRegistered. It writes an EventCreated event.
// Errors: ErrInvalid (name, MAC, lifecycle), ErrExists.
func (s *Store) CreateServer(srv Server) (Server, error) {
	if err := checkName("server", srv.Name); err != nil {
		return Server{}, fmt.Errorf("state: create server: %w", err)
	}
	if srv.BootMAC != "" {
		m, err := normalizeMAC(srv.BootMAC)
		if err != nil {
			return Server{}, fmt.Errorf("state: create server %s: %w", srv.Name, err)
		}
		srv.BootMAC = m
	}
	if srv.Lifecycle == "" {
		srv.Lifecycle = LifecycleNew
	}
	if !srv.Lifecycle.Valid() {
		return Server{}, fmt.Errorf("state: create server %s: lifecycle %q: %w", srv.Name, srv.Lifecycle, ErrInvalid)
	}
	if srv.Power.State == "" {
		srv.Power.State = PowerRegistered
	}
	if !srv.Power.State.Valid() {
		return Server{}, fmt.Errorf("state: create server %s: power %q: %w", srv.Name, srv.Power.State, ErrInvalid)
	}
	err := s.update(func(tx kvTx) error {
		b := tx.Bucket(bucketServers)
		if b.Get([]byte(srv.Name)) != nil {
			return ErrExists
		}
		now := s.nowUTC()
		srv.Revision = 1
		srv.CreatedAt, srv.UpdatedAt, srv.LifecycleAt = now, now, now
		if srv.Power.At.IsZero() {
			srv.Power.At = now
		}
		if err := s.putServer(b, srv.Name, &srv); err != nil {
			return err
		}
		return s.appendEvent(tx, &Event{Server: srv.Name, Kind: EventCreated, Actor: ActorController, To: srv.Lifecycle,
			Message: "server registered"})
	})
	if err != nil {
		return Server{}, fmt.Errorf("state: create server %s: %w", srv.Name, err)
	}
	return srv, nil
}

// Server returns the named server, or ErrNotFound.
func (s *Store) Server(name string) (Server, error) {
	var srv Server
	err := s.view(func(tx kvTx) error {
		data := tx.Bucket(bucketServers).Get([]byte(name))
		if data == nil {
			return ErrNotFound
		}
		var err error
		srv, err = s.servers.decode([]byte(name), data)
		if err != nil {
			return fmt.Errorf("decode %s: %w", name, err)
		}
		return nil
	})
	if err != nil {
		return Server{}, fmt.Errorf("state: get server %s: %w", name, err)
	}
	return srv, nil
}

// ServerFunc calls fn with the named server as stored now, without
// copying it (the decode cache's entry when the record's bytes match): fn
// must neither modify nor retain it, nor call the store. For hot paths
// that read a few fields (the boot index behind every script request of a
// boot storm), where Server's deep copy and the 736-byte value
// passed down the request's stack are avoidable work. Errors:
// ErrNotFound, decoding and the store's read errors.
func (s *Store) ServerFunc(name string, fn func(*Server)) error {
	err := s.view(func(tx kvTx) error {
		data := tx.Bucket(bucketServers).Get([]byte(name))
		if data == nil {
			return ErrNotFound
		}
		if err := s.servers.view([]byte(name), data, fn); err != nil {
			return fmt.Errorf("decode %s: %w", name, err)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("state: get server %s: %w", name, err)
	}
	return nil
}

// ServersGen returns a generation of the server records, ok false on an
// engine that cannot give one (etcd: other controllers write). Read before
// reading a server, and unchanged when read again later, it proves that no
// server record changed in between: every write transaction that opens
// the servers bucket moves it before it commits and again before the
// store's write call returns. The boot index caches on it (a
// read transaction per script request was its largest cost after the
// token mint).
func (s *Store) ServersGen() (gen uint64, ok bool) {
	if be, isBolt := s.eng.(*boltEngine); isBolt {
		return be.serversGen.Load(), true
	}
	return 0, false
}

// ListOptions filter and page ListServers. Zero values mean no filter and
// the default page size.
type ListOptions struct {
	Zone      string    // only servers in this zone
	Lifecycle Lifecycle // only servers in this lifecycle
	After     string    // resume after this server name (the previous page's Next)
	Limit     int       // page size; zero means 100, at most 10,000
}

// ServerPage is one page of ListServers, ordered by name. Next is the
// cursor for the following page, empty on the last page.
type ServerPage struct {
	Servers []Server
	Next    string
}

// MaxPageSize bounds ListOptions.Limit and EventQuery.Limit.
const MaxPageSize = 10_000

// ListServers returns servers ordered by name, filtered and paged by opts.
func (s *Store) ListServers(opts ListOptions) (ServerPage, error) {
	if opts.Limit <= 0 {
		opts.Limit = 100
	}
	if opts.Limit > MaxPageSize {
		opts.Limit = MaxPageSize
	}
	if opts.Lifecycle != "" && !opts.Lifecycle.Valid() {
		return ServerPage{}, fmt.Errorf("state: list servers: lifecycle %q: %w", opts.Lifecycle, ErrInvalid)
	}
	var page ServerPage
	err := s.view(func(tx kvTx) error {
		b := tx.Bucket(bucketServers)
		// Sizing the page up front avoids regrowing a slice of large
		// structs; for big pages, Stats (a page walk without decoding,
		// about 1 ms for 10,000 records) bounds it by the record count.
		size := opts.Limit
		if size > 1024 {
			size = min(size, b.KeyN())
		}
		page.Servers = make([]Server, 0, size)
		c := b.Cursor()
		var k, v []byte
		if opts.After == "" {
			k, v = c.First()
		} else {
			k, v = c.Seek([]byte(opts.After))
			if k != nil && string(k) == opts.After {
				k, v = c.Next()
			}
		}
		for ; k != nil; k, v = c.Next() {
			srv, err := s.servers.decode(k, v)
			if err != nil {
				return fmt.Errorf("decode server %s: %w", k, err)
			}
			if opts.Zone != "" && srv.Zone != opts.Zone {
				continue
			}
			if opts.Lifecycle != "" && srv.Lifecycle != opts.Lifecycle {
				continue
			}
			if len(page.Servers) == opts.Limit {
				page.Next = page.Servers[len(page.Servers)-1].Name
				break
			}
			page.Servers = append(page.Servers, srv)
		}
		return nil
	})
	if err != nil {
		return ServerPage{}, fmt.Errorf("state: list servers: %w", err)
	}
	return page, nil
}

// CountServers returns the number of servers per lifecycle.
func (s *Store) CountServers() (map[Lifecycle]int, error) {
	counts := map[Lifecycle]int{}
	err := s.view(func(tx kvTx) error {
		return tx.Bucket(bucketServers).ForEach(func(k, v []byte) error {
			if err := s.servers.view(k, v, func(srv *Server) { counts[srv.Lifecycle]++ }); err != nil {
				return fmt.Errorf("decode server %s: %w", k, err)
			}
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("state: count servers: %w", err)
	}
	return counts, nil
}

// StalledServers returns the names of the servers whose Stalled is set, in
// name order. It reads through the decode cache without copying records,
// so a fleet-wide check costs little more than a scan of the bucket.
func (s *Store) StalledServers() ([]string, error) {
	out, err := s.serverNames(func(srv *Server) bool { return srv.Stalled != "" })
	if err != nil {
		return nil, fmt.Errorf("state: stalled servers: %w", err)
	}
	return out, nil
}

// serverNames returns, in name order, the names of the servers for which
// match is true. match sees the cached record and must neither modify nor
// retain it.
func (s *Store) serverNames(match func(*Server) bool) ([]string, error) {
	var out []string
	err := s.view(func(tx kvTx) error {
		return tx.Bucket(bucketServers).ForEach(func(k, v []byte) error {
			if err := s.servers.view(k, v, func(srv *Server) {
				if match(srv) {
					out = append(out, srv.Name)
				}
			}); err != nil {
				return fmt.Errorf("decode server %s: %w", k, err)
			}
			return nil
		})
	})
	return out, err
}

// ServerByBootMAC returns the server whose boot MAC is mac (lower-case colon
// form, as stored), or ErrNotFound. It first reads the one record the
// decode cache's hint names (the server last written or decoded with that
// MAC) and returns it if it still holds the MAC; otherwise it scans the
// stored records' bytes for the MAC before decoding any (one pass over the
// bytes, no JSON decoding of non-matching records). Boot servers use it
// for MACs their index does not hold yet: every newly registered server's
// first netboot, which with the scan alone made commissioning a fleet
// quadratic in its size.
func (s *Store) ServerByBootMAC(mac string) (Server, error) {
	if name, ok := s.servers.hintMAC(mac); ok && mac != "" {
		var out Server
		found := false
		err := s.view(func(tx kvTx) error {
			v := tx.Bucket(bucketServers).Get([]byte(name))
			if v == nil {
				return nil
			}
			srv, err := s.servers.decode([]byte(name), v)
			if err != nil {
				return fmt.Errorf("decode server %s: %w", name, err)
			}
			out, found = srv, srv.BootMAC == mac
			return nil
		})
		if err != nil {
			return Server{}, fmt.Errorf("state: server by boot mac %s: %w", mac, err)
		}
		if found {
			return out, nil
		}
	}
	needle := []byte(`"bootMAC":"` + mac + `"`)
	var out Server
	found := false
	err := s.view(func(tx kvTx) error {
		return tx.Bucket(bucketServers).ForEach(func(k, v []byte) error {
			if found || mac == "" || !bytes.Contains(v, needle) {
				return nil
			}
			srv, err := s.servers.decode(k, v)
			if err != nil {
				return fmt.Errorf("decode server %s: %w", k, err)
			}
			if srv.BootMAC == mac {
				out, found = srv, true
			}
			return nil
		})
	})
	if err != nil {
		return Server{}, fmt.Errorf("state: server by boot mac %s: %w", mac, err)
	}
	if !found {
		return Server{}, fmt.Errorf("state: server by boot mac %s: %w", mac, ErrNotFound)
	}
	return out, nil
}

// UpdateServer applies fn to the named server inside one transaction and
// stores the result. fn must not change Name or Lifecycle (ErrLifecycleField;
// use Transition); Revision, CreatedAt and UpdatedAt are maintained by the
// store. An error from fn aborts the update and is returned wrapped.
func (s *Store) UpdateServer(name string, fn func(*Server) error) (Server, error) {
	var out Server
	err := s.update(func(tx kvTx) error {
		var err error
		out, err = s.updateServerTx(tx, name, fn)
		return err
	})
	if err != nil {
		return Server{}, fmt.Errorf("state: update server %s: %w", name, err)
	}
	return out, nil
}

func (s *Store) updateServerTx(tx kvTx, name string, fn func(*Server) error) (Server, error) {
	b := tx.Bucket(bucketServers)
	data := b.Get([]byte(name))
	if data == nil {
		return Server{}, ErrNotFound
	}
	// Through the decode cache: the record was usually just read (the
	// boot index reads a server before minting its token), and a copy is
	// cheaper than a JSON decode inside the writer lock.
	srv, err := s.servers.decode([]byte(name), data)
	if err != nil {
		return Server{}, fmt.Errorf("decode %s: %w", name, err)
	}
	orig := srv
	if err := fn(&srv); err != nil {
		return Server{}, err
	}
	if srv.Name != orig.Name {
		return Server{}, fmt.Errorf("rename to %q: %w", srv.Name, ErrInvalid)
	}
	if srv.Lifecycle != orig.Lifecycle || !srv.LifecycleAt.Equal(orig.LifecycleAt) {
		return Server{}, ErrLifecycleField
	}
	if srv.BootMAC != orig.BootMAC && srv.BootMAC != "" {
		m, err := normalizeMAC(srv.BootMAC)
		if err != nil {
			return Server{}, err
		}
		srv.BootMAC = m
	}
	if !srv.Power.State.Valid() {
		return Server{}, fmt.Errorf("power %q: %w", srv.Power.State, ErrInvalid)
	}
	srv.Revision = orig.Revision + 1
	srv.CreatedAt = orig.CreatedAt
	srv.UpdatedAt = s.nowUTC()
	return srv, s.putServer(b, name, &srv)
}

// SetPower records a power state with its source. It writes an EventPower
// event when the state changes; setting the same state only refreshes the
// time. Errors: ErrNotFound, ErrInvalid.
func (s *Store) SetPower(name string, p Power, src PowerSource) (Server, error) {
	if !p.Valid() {
		return Server{}, fmt.Errorf("state: set power %s: power %q: %w", name, p, ErrInvalid)
	}
	var out Server
	err := s.update(func(tx kvTx) error {
		var err error
		out, err = s.setPowerTx(tx, name, p, src)
		return err
	})
	if err != nil {
		return Server{}, fmt.Errorf("state: set power %s: %w", name, err)
	}
	return out, nil
}

// Move is one requested lifecycle change. Actor names who asked (an admin
// token's name, ActorController); Reason is free text kept in the event.
type Move struct {
	Server   string
	From, To Lifecycle
	Reason   string
	Actor    string // empty means ActorController
	// Update, when set, changes other fields of the record in the same
	// transaction as the move (an allocation with ready→allocated, the
	// hardware facts with commissioning→ready). It must not change Name or
	// Lifecycle; an error aborts the whole move.
	Update func(*Server) error
	// ForgetHosts, when HostReleased or HostRetired, forgets the hosts
	// running on the server (ForgetHostsOf, with ForgetReason) in the
	// move's transaction: a release or retire is never recorded with its
	// host still trusted. "" forgets nothing.
	ForgetHosts  string
	ForgetReason string
}

// Transition moves the named server from→to as ActorController. See Apply.
func (s *Store) Transition(name string, from, to Lifecycle, reason string) (Server, error) {
	return s.Apply(Move{Server: name, From: from, To: to, Reason: reason})
}

// Apply performs m as a compare-and-set inside one read-write transaction
// and writes its EventTransition event in the same transaction, then
// fsyncs. Of any number of concurrent callers with the same From, at most
// one succeeds. Errors: *TransitionError (wrapping ErrIllegalTransition or
// ErrStaleTransition, with the current lifecycle), ErrNotFound.
func (s *Store) Apply(m Move) (Server, error) {
	return s.apply(m, s.update)
}

// ApplyBatched is Apply through bbolt's DB.Batch: concurrent callers share
// one commit and one fsync, trading a few milliseconds of latency for
// throughput. Same guarantees as Apply.
func (s *Store) ApplyBatched(m Move) (Server, error) {
	return s.apply(m, s.batch)
}

func (s *Store) apply(m Move, run func(func(kvTx) error) error) (Server, error) {
	if m.Actor == "" {
		m.Actor = ActorController
	}
	var out Server
	var refused *TransitionError
	err := run(func(tx kvTx) error {
		var err error
		out, refused, err = s.applyTx(tx, m)
		return err
	})
	if refused != nil {
		return Server{}, refused
	}
	if err != nil {
		return Server{}, fmt.Errorf("state: transition %s %s→%s: %w", m.Server, m.From, m.To, err)
	}
	return out, nil
}

func (s *Store) setPowerTx(tx kvTx, name string, p Power, src PowerSource) (Server, error) {
	b := tx.Bucket(bucketServers)
	var srv Server
	if err := getJSON(b, name, &srv); err != nil {
		return Server{}, err
	}
	now := s.nowUTC()
	changed := srv.Power.State != p
	prev := srv.Power.State
	srv.Power = PowerStatus{State: p, Source: src, At: now}
	if src == PowerSourceAgent && p == PowerOff {
		srv.Power.OffClaimedAt = now // until confirm-off's own BMC read
	}
	srv.Revision++
	srv.UpdatedAt = now
	if err := s.putServer(b, name, &srv); err != nil {
		return Server{}, err
	}
	if !changed {
		return srv, nil
	}
	return srv, s.appendEvent(tx, &Event{Server: name, Kind: EventPower, Actor: ActorController, Power: p,
		Message: fmt.Sprintf("power %s→%s (%s)", prev, p, src)})
}

// putServer stores srv under name in b (the servers bucket) and
// remembers it in the decode cache (serverCache.remember).
func (s *Store) putServer(b kvBucket, name string, srv *Server) error {
	data, err := json.Marshal(srv)
	if err != nil {
		return err
	}
	if err := b.Put([]byte(name), data); err != nil {
		return err
	}
	s.servers.remember(name, data, srv)
	return nil
}

func putJSON(b kvBucket, key string, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return b.Put([]byte(key), data)
}

// getJSON decodes key from b into v, or returns ErrNotFound.
func getJSON(b kvBucket, key string, v any) error {
	data := b.Get([]byte(key))
	if data == nil {
		return ErrNotFound
	}
	if err := json.Unmarshal(data, v); err != nil {
		return fmt.Errorf("decode %s: %w", key, err)
	}
	return nil
}

// ObserveBMC records what a read of name's BMC found, started at readAt:
// the power state p (recorded with PowerSourceBMC; ""
// leaves the record's power alone) and the health rollup ("OK", "Warning",
// "Critical"; "" when the BMC does not report one). The record is written
// only when something changed, so a fleet-wide sweep costs no writes while
// nothing changes; a change appends an EventPower or EventHealth event. A
// power state recorded after readAt (a command Machina sent while the read
// was in flight) is newer than the read and is kept. It returns whether the
// record changed; ErrNotFound when name does not exist.
func (s *Store) ObserveBMC(name string, readAt time.Time, p Power, health string) (bool, error) {
	if p != "" && !p.Valid() {
		return false, fmt.Errorf("state: observe bmc %s: power %q: %w", name, p, ErrInvalid)
	}
	changed := false
	err := s.update(func(tx kvTx) error {
		changed = false // fn may run again (etcd retries a conflicting transaction)
		b := tx.Bucket(bucketServers)
		var srv Server
		if err := getJSON(b, name, &srv); err != nil {
			return err
		}
		now := s.nowUTC()
		var evs []*Event
		if p != "" && srv.Power.State != p && !srv.Power.At.After(readAt) {
			evs = append(evs, &Event{Server: name, Kind: EventPower, Actor: ActorController, Power: p,
				Message: fmt.Sprintf("power %s→%s (%s)", srv.Power.State, p, PowerSourceBMC)})
			claim, _ := srv.Power.OffClaimPending() // the sweep's read does not settle a claim: confirm-off's does
			srv.Power = PowerStatus{State: p, Source: PowerSourceBMC, At: now, OffClaimedAt: claim}
		}
		if srv.BMCError != "" {
			evs = append(evs, &Event{Server: name, Kind: EventBMCRead, Actor: ActorController, Message: "BMC read again (was: " + srv.BMCError + ")"})
			srv.BMCError = ""
		}
		if srv.Health != health {
			from, to := srv.Health, health
			if from == "" {
				from = "unknown"
			}
			if to == "" {
				to = "unknown"
			}
			evs = append(evs, &Event{Server: name, Kind: EventHealth, Actor: ActorController, Message: fmt.Sprintf("health %s→%s", from, to)})
			srv.Health = health
		}
		if len(evs) == 0 {
			return nil
		}
		changed = true
		srv.Revision++
		srv.UpdatedAt = now
		if err := s.putServer(b, name, &srv); err != nil {
			return err
		}
		for _, e := range evs {
			if err := s.appendEvent(tx, e); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return false, fmt.Errorf("state: observe bmc %s: %w", name, err)
	}
	return changed, nil
}

// BMCReadFailed records that the BMC sweep could not read name's BMC, and
// why (msg, already redacted by the caller: no credential in it). The
// record is written, with an EventBMCRead event, only when msg differs from
// the BMCError it holds; ObserveBMC clears it. A retired server gets no
// BMCError (it is not operated any more; "BMC unreadable" there is
// noise), and one it still holds is cleared. ErrNotFound when name does
// not exist.
func (s *Store) BMCReadFailed(name, msg string) (bool, error) {
	changed := false
	err := s.update(func(tx kvTx) error {
		changed = false // fn may run again (etcd retries a conflicting transaction)
		b := tx.Bucket(bucketServers)
		var srv Server
		if err := getJSON(b, name, &srv); err != nil {
			return err
		}
		if srv.Lifecycle == LifecycleRetired {
			msg = ""
		}
		if srv.BMCError == msg {
			return nil
		}
		if msg == "" {
			changed = true
			srv.BMCError = ""
			srv.Revision++
			srv.UpdatedAt = s.nowUTC()
			return s.putServer(b, name, &srv)
		}
		changed = true
		srv.BMCError = msg
		srv.Revision++
		srv.UpdatedAt = s.nowUTC()
		if err := s.putServer(b, name, &srv); err != nil {
			return err
		}
		return s.appendEvent(tx, &Event{Server: name, Kind: EventBMCRead, Actor: ActorController, Message: "BMC read failed: " + msg})
	})
	if err != nil {
		return false, fmt.Errorf("state: bmc read failed %s: %w", name, err)
	}
	return changed, nil
}

// ServersWithBMCError returns, in name order, the servers not retired
// whose last BMC sweep read failed (BMCError set) and that are not
// stalled: the ones the sweep reads first after a secret changed.
func (s *Store) ServersWithBMCError() ([]string, error) {
	out, err := s.serverNames(func(srv *Server) bool {
		return srv.BMC.Driver != "" && srv.Stalled == "" && srv.BMCError != "" && srv.Lifecycle != LifecycleRetired
	})
	if err != nil {
		return nil, fmt.Errorf("state: servers with bmc error: %w", err)
	}
	return out, nil
}

// ServersWithBMC returns, in name order, the servers that have a BMC
// (BMC.Driver set) and are not stalled: the ones a BMC sweep may read. A
// stalled server is left alone until its stall is cleared (a refused
// credential read again and again would lock the BMC account).
func (s *Store) ServersWithBMC() ([]string, error) {
	out, err := s.serverNames(func(srv *Server) bool { return srv.BMC.Driver != "" && srv.Stalled == "" })
	if err != nil {
		return nil, fmt.Errorf("state: servers with bmc: %w", err)
	}
	return out, nil
}

// applyTx is one lifecycle move inside tx; a refusal is returned both as
// the TransitionError and as the error (which aborts tx).
func (s *Store) applyTx(tx kvTx, m Move) (Server, *TransitionError, error) {
	if m.Actor == "" {
		m.Actor = ActorController
	}
	b := tx.Bucket(bucketServers)
	var srv Server
	if err := getJSON(b, m.Server, &srv); err != nil {
		return Server{}, nil, err
	}
	if !CanTransition(m.From, m.To) {
		te := &TransitionError{Server: m.Server, From: m.From, To: m.To, Current: srv.Lifecycle, Err: ErrIllegalTransition}
		return Server{}, te, te
	}
	if srv.Lifecycle != m.From {
		te := &TransitionError{Server: m.Server, From: m.From, To: m.To, Current: srv.Lifecycle, Err: ErrStaleTransition}
		return Server{}, te, te
	}
	if m.Update != nil {
		name, lc := srv.Name, srv.Lifecycle
		if err := m.Update(&srv); err != nil {
			return Server{}, nil, err
		}
		if srv.Name != name || srv.Lifecycle != lc {
			return Server{}, nil, ErrLifecycleField
		}
	}
	switch m.ForgetHosts {
	case "", HostReleased, HostRetired:
	default:
		return Server{}, nil, fmt.Errorf("forget hosts: status %q: %w", m.ForgetHosts, ErrInvalid)
	}
	now := s.nowUTC()
	srv.Lifecycle = m.To
	srv.LifecycleAt = now
	srv.Revision++
	srv.UpdatedAt = now
	if err := s.putServer(b, m.Server, &srv); err != nil {
		return Server{}, nil, err
	}
	if err := s.appendEvent(tx, &Event{Server: m.Server, Kind: EventTransition, Actor: m.Actor,
		From: m.From, To: m.To, Message: m.Reason}); err != nil {
		return Server{}, nil, err
	}
	if m.ForgetHosts != "" {
		if _, err := s.forgetHostsTx(tx, m.Server, m.ForgetHosts, m.ForgetReason); err != nil {
			return Server{}, nil, fmt.Errorf("forget hosts: %w", err)
		}
	}
	return srv, nil, nil
}
