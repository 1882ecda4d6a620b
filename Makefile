# Machina build. `make demo` runs the main job; `make test` runs every test.
GO        ?= go
BIN       := bin
OUT       := out
PKGS      := ./...
# FUZZTIME bounds each fuzz target in `make test` (CI runs a short fuzz).
FUZZTIME  ?= 10s
# TESTFLAGS are go test's flags for the full suite. The VM labs (TestVMLab,
# TestVMLabARM64, TestVMLabTrust, TestVMLabHost) are their own targets, `make lab`,
# `make lab-arm64`, `make lab-trust` and `make lab-host`, and are not part of `make test`.
TESTFLAGS ?= -race -count=1 -timeout 20m
TESTSKIP  := -skip '^TestVMLab(ARM64|Trust|Host)?$$'
SUMMARY   := $(GO) run ./scripts/testsummary

.PHONY: all build deps prep test unit unit-quick fuzz vet lint demo clean docs

all: build

build:
	$(GO) build -o $(BIN)/ ./cmd/...

# deps: the Debian packages and npm modules the tests use as real peers
# (scripts/deps.sh: installs as root or with password-less sudo, else
# prints the apt-get command and stops).
deps:
	sh scripts/deps.sh test

# test: the whole set-up and every test, no skip: deps, prep (caches),
# vet, the race-enabled suite (a missing peer FAILS naming its Debian
# package), a bounded fuzz of every fuzz target, and the check that the
# suite left nothing in / or $HOME. Ends with the summary line (skipped
# must be 0). The steps run one after another also under make -j; a new
# step is one more line here.
test:
	@[ "$$(id -u)" = 0 ] || echo "make test: not root: the tests that need root (network namespaces, loop devices, LVM) will fail; run it as root (sudo make test), or make unit-quick for the quick mode"
	@$(MAKE) --no-print-directory deps
	@$(MAKE) --no-print-directory prep
	@$(MAKE) --no-print-directory vet
	@$(MAKE) --no-print-directory unit
	@$(MAKE) --no-print-directory fuzz
	@cat $(OUT)/test-summary.txt

vet:
	$(GO) vet $(PKGS)

# prep: the caches some tests read, built before the suite so that no test
# writes outside its temporary folders: Debian's kernel package and the
# ramdisk (out/ramdisk, apt-get download), the arm64 ramdisk and GRUB image
# (out/ramdisk/arm64, out/boot), and as root the VM lab's OS image
# (make os-image: debootstrap, a few minutes the first time, cached in
# ~/.cache/machina/os-image).
prep:
	@$(MAKE) --no-print-directory ramdisk ARCH=amd64
	@$(MAKE) --no-print-directory ramdisk ARCH=arm64
	sh scripts/build-grub-arm64.sh
	@if [ "$$(id -u)" = 0 ]; then $(MAKE) --no-print-directory os-image; \
	else echo "make test: not root: the VM lab's OS image is not built (make os-image needs root); lab/vm/osimage TestEnsureAndBoot will fail"; fi

# unit: the suite through scripts/testsummary (go test -json: plain
# go test's output plus the summary line; fails on any skip), between the
# two halves of scripts/fscheck.sh. The raw events stay in out/test.json.
unit:
	@mkdir -p $(OUT)
	sh scripts/fscheck.sh before $(OUT)/fscheck.before
	@rc=0; $(SUMMARY) -json $(OUT)/test.json -summary $(OUT)/test-summary.txt -- $(TESTFLAGS) $(TESTSKIP) $(PKGS) || rc=$$?; \
	sh scripts/fscheck.sh after $(OUT)/fscheck.before || rc=1; exit $$rc

# unit-quick: the QUICK MODE, not a full run: SKIP_PEERS=1 turns a missing
# peer (ipmi_sim, qemu, chromium, root, ...) into a skip, and the race
# detector is off. No installs. The summary counts the skips.
unit-quick:
	SKIP_PEERS=1 $(SUMMARY) -allow-skip -label "make unit-quick (quick mode)" -- -count=1 -timeout 20m $(TESTSKIP) $(PKGS)

fuzz:
	GO=$(GO) sh scripts/fuzz.sh $(FUZZTIME)

lint:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt: files above need formatting"; exit 1; }
	$(GO) vet $(PKGS)
	$(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2 $(PKGS)

# demo: the main job on the embedded default: the controller against the
# simulated lab (example site, loopback only). As root it first installs
# openipmi for the IPMI servers (scripts/deps.sh demo); otherwise it goes on
# without and machina sim says which servers run Redfish instead. Ctrl-C
# stops it and removes the lab folder (DEMO_FLAGS=--keep keeps it).
demo: build
	@sh scripts/deps.sh demo || echo "make demo: going on without them (machina sim says which servers this changes)"
	$(BIN)/machinactl validate inventory-example
	$(BIN)/machina sim $(DEMO_FLAGS)

clean:
	rm -rf $(BIN)

# docs: regenerate the reference pages from their sources of truth: under
# docs/reference/ from the JSON Schemas and the cobra command trees, and
# api/openapi.json with docs/api.md from the admin routes' table
# (controller/openapi_ops.go); `make test` fails when a committed page is
# stale.
docs:
	MACHINA_UPDATE_DOCS=1 $(GO) test -count=1 -run 'TestReferenceCurrent|TestCLIReference' ./schema ./cmd/machina ./cmd/machinactl
	$(GO) test -count=1 -run TestOpenAPIDocumentFresh ./controller -update

# ramdisk: kernel from Debian's linux-image-$(ARCH) + initrd with the static
# agent and its modules; writes out/ramdisk/{vmlinuz,initrd.cpio.gz,manifest.txt}
# (ARCH=amd64, the default) or out/ramdisk/arm64/ (ARCH=arm64; no root needed).
ARCH ?= amd64
.PHONY: ramdisk
ramdisk:
	ARCH=$(ARCH) scripts/build-ramdisk.sh
# ipxe-iso: the virtual-media boot ISOs (BIOS: embedded script; UEFI: iPXE + DHCP
# user class) pointing at MACHINA_CONTROLLER_URL, written to bin/iso/.
MACHINA_CONTROLLER_URL ?= http://10.99.0.1:8080
.PHONY: ipxe-iso
ipxe-iso:
	sh scripts/metal/build-ipxe-iso.sh "$(MACHINA_CONTROLLER_URL)" $(BIN)/iso
# sb-iso: the virtual-media boot ISO of Secure Boot servers (shim + Debian's signed GRUB, which
# fetches its configuration by TFTP from MACHINA_CONTROLLER_URL's host), written to bin/iso/.
.PHONY: sb-iso
sb-iso:
	sh scripts/metal/build-sb-iso.sh "$(MACHINA_CONTROLLER_URL)" $(BIN)/iso
# os-image: the VM lab's Debian 12 disk image (debootstrap; root), built once and cached outside the repo.
.PHONY: os-image
os-image:
	scripts/lab/build-os-image.sh
# lab: the VM lab (lab/vm): controller in a network namespace, five qemu VMs side by side
# (TCG; BIOS+Redfish virtual media, UEFI+Redfish PXE, BIOS+ipmi_sim PXE with the NIC first in its boot order
# whatever the BMC sets, UEFI+Redfish virtual media, BIOS+pyghmi PXE: a BMC that keeps only the boot device
# and applies it at power-on) from commissioning to deploy, first-boot join, release and retire. Root, 6-10 minutes on an idle
# machine (budget 15; -time-scale for a loaded one). Not part of `make test`. LAB_FLAGS e.g. -stage commission -keep.
.PHONY: lab
lab: build ramdisk
	$(BIN)/lab -root . $(LAB_FLAGS)
# lab-arm64: the arm64 VM lab (lab/vm TestVMLabARM64): one arm64 UEFI VM (qemu-system-aarch64,
# TCG, AAVMF) network-boots through GRUB's arm64 image from machina serve's DHCP and TFTP, commissions
# (arch arm64 in the API and the status commit), a pin of the amd64 lab profile onto it is refused
# (ArchMismatch), and a pin of the arm64 profile deploys the minimal arm64 OS image, which boots from
# the disk and joins. Builds the binaries, the arm64 node agent, ramdisk, GRUB image and OS image and
# the (cached) amd64 OS image first. Root, 5-10 minutes under TCG.
.PHONY: lab-arm64
lab-arm64: build node-arm64
	@$(MAKE) --no-print-directory ramdisk ARCH=arm64
	sh scripts/build-grub-arm64.sh
	@$(MAKE) --no-print-directory os-image os-image-arm64
	$(BIN)/lab -root . -arm64 $(LAB_FLAGS)
# lab-trust: the Secure Boot VM lab (lab/vm TestVMLabTrust): one x86-64 VM with OVMF Secure Boot,
# Microsoft's keys and a swtpm TPM 2.0 network-boots Debian's signed shim and GRUB from machina
# serve, then the signed kernel and the ramdisk, locked down; attests against the boot chain the
# controller computes from the files it serves (profile attestation: required) and commissions;
# then its EK is pinned in Git, a spoofing VM with its own swtpm and the same MAC is refused the
# plan, it deploys with quotes, boots its OS with Secure Boot on and joins, and the spoofer's
# replays at plan, done and join are refused; last, the controller is restarted on a kernel whose
# signature was removed and the VM's release wipe shows BootStalled (GRUB refused the kernel).
# Root, about 10-20 minutes under TCG.
.PHONY: lab-trust
lab-trust: build ramdisk
	@$(MAKE) --no-print-directory os-image
	MACHINA_VM_LAB_TRUST=1 $(GO) test -count=1 -timeout 40m -v -run '^TestVMLabTrust$$' ./lab/vm/
# lab-host: the host VM lab (lab/vm TestVMLabHost): one UEFI VM with a swtpm TPM 2.0, two NICs bonded
# (active-backup) under a tagged VLAN and a bridge with the server's address and MTU 9000, a RAID1 root
# over two virtio disks and a volume group on an NVMe disk, against a VLAN-filtering bridge with lldpd:
# LLDP and the cabling guard at commissioning, deploy and first boot checked over SSH, attestation, a
# degraded boot with one root disk pulled, release with erase zero and the disk images read back.
.PHONY: lab-host
lab-host: build ramdisk os-image
	$(BIN)/lab -root . -host $(LAB_FLAGS)
# node-arm64: bin/arm64/machina-node, the node agent arm64 hosts download (machina serve --node-binary-arm64).
.PHONY: node-arm64
node-arm64:
	CGO_ENABLED=0 GOARCH=arm64 $(GO) build -trimpath -o $(BIN)/arm64/ ./cmd/machina-node
# os-image-arm64: the arm64 lab's minimal OS image (lab/vm/osimage/build-arm64.sh: Debian arm64 packages
# unpacked, no root, no qemu-user), out/os-image-arm64/{os.img,SHA256SUMS}.
.PHONY: os-image-arm64
os-image-arm64:
	sh lab/vm/osimage/build-arm64.sh
# deb: bin/machina_VERSION_amd64.deb (nfpm, pinned in scripts/build-deb.sh): binaries,
# machina.service, default config, the ramdisk when out/ramdisk is built (make ramdisk).
.PHONY: deb
deb:
	GO=$(GO) sh scripts/build-deb.sh
