package attestation

import (
	"bytes"
	"crypto/sha256"
	"debug/pe"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
)

// Authenticode returns the SHA-256 Authenticode digest of the PE/COFF image
// img: the digest UEFI measures into PCR 4 for an EFI application it
// starts (EV_EFI_BOOT_SERVICES_APPLICATION; TCG PC Client PFP §10.4.4,
// UEFI 2.x §32.2.3 "PE/COFF image hash"), that shim measures for the
// images it loads or verifies (GRUB, and the kernel GRUB hands it through
// shim_lock), and that the image's signature signs
// (SpcIndirectDataContent's messageDigest).
//
// The algorithm is the one of Microsoft's "Windows Authenticode Portable
// Executable Signature Format" (Calculating the PE Image Hash), as EDK2's
// DxeImageVerificationLib and sbsigntool implement it: hash the headers
// up to SizeOfHeaders except the CheckSum field and the certificate-table
// data directory entry; then each section's raw data, sections in order of
// PointerToRawData; then any data after the last section, up to the start
// of the attribute certificate table (which is not hashed). No Go module
// for this is on the module proxy this project may use (foxboron/go-uefi is
// not served), so it is written here over debug/pe.
func Authenticode(img []byte) ([]byte, error) {
	f, err := pe.NewFile(bytes.NewReader(img))
	if err != nil {
		return nil, fmt.Errorf("authenticode: %w", err)
	}
	defer f.Close()
	if len(img) < 0x40 {
		return nil, errors.New("authenticode: image too short")
	}
	peOff := int(binary.LittleEndian.Uint32(img[0x3c:]))
	optOff := peOff + 4 + 20 // signature, COFF file header
	var sizeOfHeaders uint32
	var ddOff int // offset of the data directory
	var ndd uint32
	switch oh := f.OptionalHeader.(type) {
	case *pe.OptionalHeader64:
		sizeOfHeaders, ddOff, ndd = oh.SizeOfHeaders, optOff+112, oh.NumberOfRvaAndSizes
	case *pe.OptionalHeader32:
		sizeOfHeaders, ddOff, ndd = oh.SizeOfHeaders, optOff+96, oh.NumberOfRvaAndSizes
	default:
		return nil, errors.New("authenticode: no optional header")
	}
	checksumOff := optOff + 64 // same offset in PE32 and PE32+
	certDirOff := ddOff + 8*pe.IMAGE_DIRECTORY_ENTRY_SECURITY
	if int(sizeOfHeaders) > len(img) || checksumOff+4 > int(sizeOfHeaders) {
		return nil, errors.New("authenticode: headers beyond the image")
	}
	var certOff, certSize int
	h := sha256.New()
	h.Write(img[:checksumOff])
	if ndd > pe.IMAGE_DIRECTORY_ENTRY_SECURITY {
		if certDirOff+8 > int(sizeOfHeaders) {
			return nil, errors.New("authenticode: data directory beyond the headers")
		}
		certOff = int(binary.LittleEndian.Uint32(img[certDirOff:]))
		certSize = int(binary.LittleEndian.Uint32(img[certDirOff+4:]))
		h.Write(img[checksumOff+4 : certDirOff])
		h.Write(img[certDirOff+8 : sizeOfHeaders])
	} else {
		h.Write(img[checksumOff+4 : sizeOfHeaders])
	}
	secs := slices.Clone(f.Sections)
	slices.SortStableFunc(secs, func(a, b *pe.Section) int { return int(a.Offset) - int(b.Offset) })
	hashed := int(sizeOfHeaders)
	for _, s := range secs {
		if s.Size == 0 {
			continue
		}
		end := int(s.Offset) + int(s.Size)
		if end > len(img) || int(s.Offset) < 0 {
			return nil, fmt.Errorf("authenticode: section %s beyond the image", s.Name)
		}
		h.Write(img[s.Offset:end])
		hashed += int(s.Size)
	}
	// Data after the sections, up to the certificate table (which the
	// signature appends at the end of the file).
	end := len(img)
	if certSize > 0 {
		if certOff < hashed || certOff+certSize > len(img) {
			return nil, errors.New("authenticode: certificate table overlaps the image")
		}
		end = certOff
	}
	if end > hashed {
		h.Write(img[hashed:end])
	}
	return h.Sum(nil), nil
}
