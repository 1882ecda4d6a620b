package agent

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	v1 "github.com/machina-metal/machina/api/v1"
)

// secureEraser runs a drive's own erase once its support was checked; it
// returns the v1.DiskErase method that ran.
type secureEraser interface {
	erase(ctx context.Context) (string, error)
	// describe says what will run and what the drive reported (for the log).
	describe() string
	// expect is how long the erase is expected to take (for the progress
	// estimate).
	expect() time.Duration
}

// nvmeNamespace matches an NVMe namespace's block device (nvme0n1; not a
// partition nvme0n1p1, nor a multipath path device nvme0c0n1).
var nvmeNamespace = regexp.MustCompile(`^nvme[0-9]+n[0-9]+$`)

// newSecureEraser checks that the disk can do a secure erase and returns
// what runs it: NVMe Format with user data erase for an NVMe namespace, ATA
// SECURITY ERASE UNIT for a drive on libata (transport "sata"). Anything
// else (SCSI/SAS, virtio, USB, loop) is an *EraseUnsupportedError: SCSI
// SANITIZE and FORMAT UNIT are not implemented, and a virtual disk has no
// erase of its own.
func newSecureEraser(f *os.File, cfg EraseConfig) (secureEraser, error) {
	name := cfg.Disk.Name
	switch {
	case nvmeNamespace.MatchString(name):
		nsid, err := strconv.ParseUint(readTrim(filepath.Join(cfg.SysBlock, "nsid")), 10, 32)
		if err != nil || nsid == 0 {
			return nil, fmt.Errorf("erase secure %s: namespace ID from sysfs nsid: %q", name, readTrim(filepath.Join(cfg.SysBlock, "nsid")))
		}
		return prepareNVMe(fileNVMe{f}, name, uint32(nsid), cfg.SecureTimeout)
	case cfg.Disk.Transport == "sata":
		return prepareATA(fileATA{f}, name, cfg.SecureTimeout)
	}
	tr := cfg.Disk.Transport
	if tr == "" {
		tr = "unknown"
	}
	return nil, &EraseUnsupportedError{Method: v1.EraseSecure, Disk: name,
		Why: fmt.Sprintf("not an NVMe namespace or an ATA drive (transport %s): only NVMe Format and ATA SECURITY ERASE UNIT are implemented", tr)}
}

// defaultSecureTimeout bounds one drive erase command when
// EraseConfig.SecureTimeout is zero.
const defaultSecureTimeout = 4 * time.Hour

// ---- NVMe (NVM Express Base Specification 2.0) ----

// nvmeAdminCmd is struct nvme_passthru_cmd (linux/nvme_ioctl.h), 72 bytes,
// the argument of NVME_IOCTL_ADMIN_CMD.
type nvmeAdminCmd struct {
	Opcode      uint8
	Flags       uint8
	Rsvd1       uint16
	NSID        uint32
	CDW2, CDW3  uint32
	Metadata    uint64
	Addr        uint64
	MetadataLen uint32
	DataLen     uint32
	CDW10       uint32
	CDW11       uint32
	CDW12       uint32
	CDW13       uint32
	CDW14       uint32
	CDW15       uint32
	TimeoutMS   uint32
	Result      uint32
}

// nvmeIoctlAdminCmd is NVME_IOCTL_ADMIN_CMD, _IOWR('N', 0x41, struct
// nvme_admin_cmd).
const nvmeIoctlAdminCmd = 0xC0484E41

// NVMe admin opcodes and values used here.
const (
	nvmeOpIdentify  = 0x06 // §5.17
	nvmeOpFormatNVM = 0x80 // §5.23
	nvmeCNSNS       = 0x00 // Identify Namespace data structure
	nvmeCNSCtrl     = 0x01 // Identify Controller data structure
	nvmeSESUserData = 0x1  // Format NVM CDW10 SES 001b: user data erase
	nvmeAllNS       = 0xFFFFFFFF
)

// nvmeAdmin sends one admin command with an optional data buffer and
// returns the NVMe status (0 is success).
type nvmeAdmin interface {
	admin(c nvmeAdminCmd, data []byte) (status uint32, err error)
}

// fileNVMe sends admin commands through NVME_IOCTL_ADMIN_CMD on the
// namespace's block device (the driver passes them to its controller).
type fileNVMe struct{ f *os.File }

func (n fileNVMe) admin(c nvmeAdminCmd, data []byte) (uint32, error) {
	// The driver reads and writes the buffer by its address: it must not
	// be Go memory that the runtime may move (a stack), so it is mapped.
	var buf []byte
	if len(data) > 0 {
		var err error
		if buf, err = unix.Mmap(-1, 0, len(data), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE); err != nil {
			return 0, fmt.Errorf("nvme buffer: %w", err)
		}
		defer unix.Munmap(buf)
		copy(buf, data)
		c.Addr, c.DataLen = uint64(uintptr(unsafe.Pointer(&buf[0]))), uint32(len(buf))
	}
	conn, err := n.f.SyscallConn()
	if err != nil {
		return 0, err
	}
	var r uintptr
	var errno unix.Errno
	if err := conn.Control(func(fd uintptr) {
		r, _, errno = unix.Syscall(unix.SYS_IOCTL, fd, nvmeIoctlAdminCmd, uintptr(unsafe.Pointer(&c)))
	}); err != nil {
		return 0, err
	}
	if errno != 0 {
		return 0, fmt.Errorf("NVME_IOCTL_ADMIN_CMD opcode %#02x: %w", c.Opcode, errno)
	}
	copy(data, buf)
	return uint32(r), nil
}

// nvmeFormat is a checked NVMe Format NVM with user data erase.
type nvmeFormat struct {
	dev     nvmeAdmin
	name    string
	cmd     nvmeAdminCmd
	sanicap uint32
	fna     byte
}

// prepareNVMe reads Identify Controller (OACS bit 1: Format NVM supported;
// FNA byte 524: bit 0 format and bit 1 secure erase apply to all
// namespaces; SANICAP bytes 331:328, logged) and Identify Namespace
// (FLBAS byte 26, DPS byte 29) and builds the Format NVM command that
// keeps the namespace's LBA format, metadata and protection settings and
// sets SES to user data erase. When FNA says the erase applies to all
// namespaces, the command names them all (NSID FFFFFFFFh), as the
// controller will erase them all anyway.
func prepareNVMe(dev nvmeAdmin, name string, nsid uint32, timeout time.Duration) (*nvmeFormat, error) {
	ctrl := make([]byte, 4096)
	if st, err := dev.admin(nvmeAdminCmd{Opcode: nvmeOpIdentify, CDW10: nvmeCNSCtrl}, ctrl); err != nil || st != 0 {
		return nil, nvmeErr(name, "identify controller", st, err)
	}
	oacs := binary.LittleEndian.Uint16(ctrl[256:])
	sanicap := binary.LittleEndian.Uint32(ctrl[328:])
	fna := ctrl[524]
	if oacs&(1<<1) == 0 {
		return nil, &EraseUnsupportedError{Method: v1.EraseSecure, Disk: name,
			Why: fmt.Sprintf("the NVMe controller does not support Format NVM (Identify Controller OACS %#04x, bit 1 clear; SANICAP %#08x)", oacs, sanicap)}
	}
	ns := make([]byte, 4096)
	if st, err := dev.admin(nvmeAdminCmd{Opcode: nvmeOpIdentify, NSID: nsid, CDW10: nvmeCNSNS}, ns); err != nil || st != 0 {
		return nil, nvmeErr(name, "identify namespace", st, err)
	}
	flbas, dps := ns[26], ns[29]
	lbaf := uint32(flbas&0x0f) | uint32(flbas>>5&0x3)<<4
	mset := uint32(flbas >> 4 & 1)
	pi, pil := uint32(dps&0x7), uint32(dps>>3&1)
	if timeout <= 0 {
		timeout = defaultSecureTimeout
	}
	cmd := nvmeAdminCmd{Opcode: nvmeOpFormatNVM, NSID: nsid,
		CDW10:     lbaf&0xf | mset<<4 | pi<<5 | pil<<8 | nvmeSESUserData<<9 | (lbaf>>4)<<12,
		TimeoutMS: uint32(min(timeout.Milliseconds(), int64(^uint32(0))))}
	if fna&0x3 != 0 {
		cmd.NSID = nvmeAllNS
	}
	return &nvmeFormat{dev: dev, name: name, cmd: cmd, sanicap: sanicap, fna: fna}, nil
}

// expect is the command timeout: Format NVM reports no estimate.
func (n *nvmeFormat) expect() time.Duration { return time.Duration(n.cmd.TimeoutMS) * time.Millisecond }

func (n *nvmeFormat) describe() string {
	return fmt.Sprintf("NVMe Format NVM nsid %#x cdw10 %#x (FNA %#02x, SANICAP %#x)", n.cmd.NSID, n.cmd.CDW10, n.fna, n.sanicap)
}

func (n *nvmeFormat) erase(context.Context) (string, error) {
	// The ioctl cannot be cancelled: the drive's format runs to its end
	// (bounded by TimeoutMS).
	if st, err := n.dev.admin(n.cmd, nil); err != nil || st != 0 {
		return "nvme-format-user-data-erase", nvmeErr(n.name, "format nvm (user data erase)", st, err)
	}
	return "nvme-format-user-data-erase", nil
}

// nvmeErr names a failed admin command and its status (Status Code Type
// bits 10:8, Status Code bits 7:0 of the ioctl's return, §4.2.3).
func nvmeErr(name, op string, status uint32, err error) error {
	if err != nil {
		return fmt.Errorf("nvme %s %s: %w", op, name, err)
	}
	return fmt.Errorf("nvme %s %s: status %#x (SCT %d, SC %#02x)", op, name, status, status>>8&0x7, status&0xff)
}

// ---- ATA (ATA8-ACS security feature set, SAT-4 ATA PASS-THROUGH) ----

// sgIOHdr is struct sg_io_hdr (scsi/sg.h), 88 bytes on 64-bit Linux.
type sgIOHdr struct {
	InterfaceID    int32
	DxferDirection int32
	CmdLen         uint8
	MxSbLen        uint8
	IovecCount     uint16
	DxferLen       uint32
	Dxferp         uintptr
	Cmdp           uintptr
	Sbp            uintptr
	Timeout        uint32
	Flags          uint32
	PackID         int32
	_              [4]byte
	UsrPtr         uintptr
	Status         uint8
	MaskedStatus   uint8
	MsgStatus      uint8
	SbLenWr        uint8
	HostStatus     uint16
	DriverStatus   uint16
	Resid          int32
	Duration       uint32
	Info           uint32
}

// SG_IO and its data directions (scsi/sg.h).
const (
	sgIO          = 0x2285
	sgDxferNone   = -1
	sgDxferToDev  = -2
	sgDxferFromDv = -3
)

// ATA commands (ATA8-ACS §7) and ATA PASS-THROUGH (16) protocols (SAT-4
// §12.2.2.3).
const (
	ataIdentify         = 0xEC
	ataSecSetPassword   = 0xF1
	ataSecErasePrepare  = 0xF3
	ataSecEraseUnit     = 0xF4
	ataSecDisablePasswd = 0xF6
	ataProtoNonData     = 3
	ataProtoPIOIn       = 4
	ataProtoPIOOut      = 5
)

// ata16 builds an ATA PASS-THROUGH (16) CDB for a 28-bit command of the
// given protocol that moves at most one 512-byte block (sector count 1,
// T_LENGTH in the count field, BYTE_BLOCK 1; T_DIR 1 for data in).
func ata16(cmd byte, proto byte) [16]byte {
	var c [16]byte
	c[0] = 0x85
	c[1] = proto << 1
	switch proto {
	case ataProtoPIOIn:
		c[2] = 1<<3 | 1<<2 | 2 // T_DIR from device, blocks, length in count
		c[6] = 1
	case ataProtoPIOOut:
		c[2] = 1<<2 | 2
		c[6] = 1
	}
	c[13] = 0x40 // device: LBA mode
	c[14] = cmd
	return c
}

// ataDev runs one ATA PASS-THROUGH (16) with its data (nil for non-data).
type ataDev interface {
	pass(cdb [16]byte, dir int32, data []byte, timeout time.Duration) error
}

// fileATA sends the CDB with SG_IO on the disk's block device (libata's
// SAT layer passes ATA PASS-THROUGH to the drive).
type fileATA struct{ f *os.File }

func (a fileATA) pass(cdb [16]byte, dir int32, data []byte, timeout time.Duration) error {
	// CDB, sense and data in one mapping (see fileNVMe.admin): 16 + 32
	// bytes, then the data.
	buf, err := unix.Mmap(-1, 0, 48+len(data), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return fmt.Errorf("sg_io buffer: %w", err)
	}
	defer unix.Munmap(buf)
	copy(buf, cdb[:])
	sense := buf[16:48]
	copy(buf[48:], data)
	h := sgIOHdr{InterfaceID: 'S', DxferDirection: dir, CmdLen: 16, MxSbLen: uint8(len(sense)),
		Cmdp: uintptr(unsafe.Pointer(&buf[0])), Sbp: uintptr(unsafe.Pointer(&sense[0])),
		Timeout: uint32(min(timeout.Milliseconds(), int64(^uint32(0))))}
	if len(data) > 0 {
		h.Dxferp, h.DxferLen = uintptr(unsafe.Pointer(&buf[48])), uint32(len(data))
	}
	conn, err := a.f.SyscallConn()
	if err != nil {
		return err
	}
	var errno unix.Errno
	if err := conn.Control(func(fd uintptr) {
		_, _, errno = unix.Syscall(unix.SYS_IOCTL, fd, sgIO, uintptr(unsafe.Pointer(&h)))
	}); err != nil {
		return err
	}
	if errno != 0 {
		return fmt.Errorf("SG_IO ATA command %#02x: %w", cdb[14], errno)
	}
	if h.Status != 0 || h.HostStatus != 0 || h.DriverStatus&^0x08 != 0 {
		st, er := ataStatusFromSense(sense[:min(int(h.SbLenWr), len(sense))])
		return fmt.Errorf("ATA command %#02x failed (SCSI status %#02x, host %#x, driver %#x, ATA status %#02x, error %#02x)", cdb[14], h.Status, h.HostStatus, h.DriverStatus, st, er)
	}
	copy(data, buf[48:])
	return nil
}

// ataStatusFromSense reads the ATA Status Return descriptor (code 09h,
// SAT-4 §12.2.2.6) of descriptor-format sense data.
func ataStatusFromSense(s []byte) (status, errReg byte) {
	if len(s) < 8 || s[0]&0x7f != 0x72 {
		return 0, 0
	}
	for d := s[8:]; len(d) >= 2; d = d[min(len(d), 2+int(d[1])):] {
		if d[0] == 0x09 && len(d) >= 14 {
			return d[13], d[3]
		}
	}
	return 0, 0
}

// ataErase is a checked ATA security erase.
type ataErase struct {
	dev      ataDev
	name     string
	enhanced bool
	timeout  time.Duration
	estimate time.Duration // the drive's own (IDENTIFY word 89 or 90); 0 unknown
}

// expect is the drive's estimate, else the command timeout.
func (e *ataErase) expect() time.Duration {
	if e.estimate > 0 {
		return e.estimate
	}
	return e.timeout
}

// prepareATA reads IDENTIFY DEVICE and refuses a drive without the
// security feature set (word 128 bit 0; word 82 bit 1), one whose security
// is frozen (bit 3), locked (bit 2), already has a user password (bit 1:
// Machina does not know it) or whose password attempts are used up
// (bit 4). The erase's timeout is the larger of the configured one and
// twice the drive's own estimate (word 89, or word 90 for the enhanced
// erase used when bit 5 says it is supported).
func prepareATA(dev ataDev, name string, timeout time.Duration) (*ataErase, error) {
	id := make([]byte, 512)
	if err := dev.pass(ata16(ataIdentify, ataProtoPIOIn), sgDxferFromDv, id, time.Minute); err != nil {
		return nil, fmt.Errorf("ata identify %s: %w", name, err)
	}
	w := func(i int) uint16 { return binary.LittleEndian.Uint16(id[2*i:]) }
	sec := w(128)
	unsupported := func(why string) error {
		return &EraseUnsupportedError{Method: v1.EraseSecure, Disk: name, Why: why}
	}
	switch {
	case sec&1 == 0 || w(82)&(1<<1) == 0:
		return nil, unsupported("the drive does not support the ATA Security feature set (IDENTIFY word 128 bit 0 clear)")
	case sec&(1<<3) != 0:
		return nil, unsupported("ATA security is frozen (the firmware sent SECURITY FREEZE LOCK at boot; a suspend and resume or a hot-plug of the drive unfreezes it)")
	case sec&(1<<2) != 0:
		return nil, unsupported("the drive is locked with a password Machina did not set")
	case sec&(1<<1) != 0:
		return nil, unsupported("a user password Machina did not set is enabled on the drive")
	case sec&(1<<4) != 0:
		return nil, unsupported("the drive's security password attempt counter has expired (power-cycle it)")
	}
	e := &ataErase{dev: dev, name: name, enhanced: sec&(1<<5) != 0, timeout: timeout}
	if e.timeout <= 0 {
		e.timeout = defaultSecureTimeout
	}
	est := w(89)
	if e.enhanced {
		est = w(90)
	}
	e.estimate = ataEraseTime(est)
	if 2*e.estimate > e.timeout {
		e.timeout = 2 * e.estimate
	}
	return e, nil
}

// ataEraseTime decodes IDENTIFY word 89 or 90 (ACS-3 §7.12.7.46): bit 15
// set: bits 14:0 in units of 2 minutes; else bits 7:0 (255: more than 508
// minutes, taken as 8 hours). 0 means no estimate.
func ataEraseTime(word uint16) time.Duration {
	switch {
	case word&0x8000 != 0:
		return time.Duration(word&0x7fff) * 2 * time.Minute
	case word&0xff == 255:
		return 8 * time.Hour
	}
	return time.Duration(word&0xff) * 2 * time.Minute
}

// securityBlock is the 512-byte data of SECURITY SET PASSWORD, ERASE UNIT
// and DISABLE PASSWORD: word 0 control (bit 0: 0 user password; bit 1:
// enhanced erase), words 1-16 the password.
func securityBlock(enhanced bool, pw []byte) []byte {
	b := make([]byte, 512)
	if enhanced {
		b[0] = 1 << 1
	}
	copy(b[2:34], pw)
	return b
}

func (e *ataErase) describe() string {
	return fmt.Sprintf("ATA SECURITY ERASE UNIT (enhanced %v, timeout %s)", e.enhanced, e.timeout)
}

func (e *ataErase) erase(context.Context) (string, error) {
	method := "ata-security-erase"
	if e.enhanced {
		method = "ata-enhanced-security-erase"
	}
	// A one-time random user password; it never leaves this function.
	pw := make([]byte, 32)
	if _, err := rand.Read(pw); err != nil {
		return method, err
	}
	if err := e.dev.pass(ata16(ataSecSetPassword, ataProtoPIOOut), sgDxferToDev, securityBlock(false, pw), time.Minute); err != nil {
		return method, fmt.Errorf("ata security set password %s: %w", e.name, err)
	}
	err := e.dev.pass(ata16(ataSecErasePrepare, ataProtoNonData), sgDxferNone, nil, time.Minute)
	if err == nil {
		err = e.dev.pass(ata16(ataSecEraseUnit, ataProtoPIOOut), sgDxferToDev, securityBlock(e.enhanced, pw), e.timeout)
	}
	if err != nil {
		// Do not leave the drive locked by a password nobody knows.
		if derr := e.dev.pass(ata16(ataSecDisablePasswd, ataProtoPIOOut), sgDxferToDev, securityBlock(false, pw), time.Minute); derr != nil {
			return method, fmt.Errorf("ata security erase unit %s: %w; and disabling the agent's password failed, the drive may stay locked: %v", e.name, err, derr)
		}
		return method, fmt.Errorf("ata security erase unit %s: %w", e.name, err)
	}
	// A successful erase disables the password (ATA8-ACS §7.45).
	return method, nil
}
