# Machina build. `make demo` runs the main job; `make test` runs every test.
GO        ?= go
BIN       := bin
PKGS      := ./...
# FUZZTIME bounds each fuzz target in `make test` (CI runs a short fuzz).
FUZZTIME  ?= 10s

.PHONY: all build test unit fuzz lint demo clean

all: build

build:
	$(GO) build -o $(BIN)/ ./cmd/...

# test: vet, the race-enabled suite, then a bounded fuzz of every fuzz target.
test: unit fuzz

unit:
	$(GO) vet $(PKGS)
	$(GO) test -race -count=1 -timeout 20m $(PKGS)

fuzz:
	GO=$(GO) sh scripts/fuzz.sh $(FUZZTIME)

lint:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt: files above need formatting"; exit 1; }
	$(GO) vet $(PKGS)
	$(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2 $(PKGS)

# demo: the main job on the embedded default: the controller against the
# simulated lab (example site, loopback only, no root). Ctrl-C stops it.
demo: build
	$(BIN)/machinactl validate inventory-example
	$(BIN)/machina sim $(DEMO_FLAGS)

clean:
	rm -rf $(BIN)

# ramdisk: kernel from Debian's linux-image-amd64 + initrd with the static agent
# and its modules; writes out/ramdisk/{vmlinuz,initrd.cpio.gz,manifest.txt}.
.PHONY: ramdisk
ramdisk:
	scripts/build-ramdisk.sh
# ipxe-iso: the virtual-media boot ISOs (BIOS: embedded script; UEFI: iPXE + DHCP
# user class) pointing at MACHINA_CONTROLLER_URL, written to bin/iso/.
MACHINA_CONTROLLER_URL ?= http://10.99.0.1:8080
.PHONY: ipxe-iso
ipxe-iso:
	sh scripts/metal/build-ipxe-iso.sh "$(MACHINA_CONTROLLER_URL)" $(BIN)/iso
# os-image: the VM lab's Debian 12 disk image (debootstrap; root), built once and cached outside the repo.
.PHONY: os-image
os-image:
	scripts/lab/build-os-image.sh
# lab: the VM lab (lab/vm): controller in a network namespace, three qemu VMs
# (TCG; BIOS+Redfish, UEFI+Redfish, BIOS+ipmi_sim) from PXE commissioning to
# deploy, first-boot join, release and retire. Root. LAB_FLAGS e.g. -stage commission -keep.
.PHONY: lab
lab: build ramdisk
	$(BIN)/lab -root . $(LAB_FLAGS)
# deb: bin/machina_VERSION_amd64.deb (nfpm, pinned in scripts/build-deb.sh): binaries,
# machina.service, default config, the ramdisk when out/ramdisk is built (make ramdisk).
.PHONY: deb
deb:
	GO=$(GO) sh scripts/build-deb.sh
