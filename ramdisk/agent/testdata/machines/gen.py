#!/usr/bin/env python3
"""Generates the recorded machine trees (*.tree) used by facts_test.go.

Each machine is modelled on a real server's sysfs/procfs layout (paths, file
names and formats as Linux 6.1 exports them); values are invented but typical.
Output format (read by agenttest.WriteTree):
  -- path --            file with the following lines as content
  -- path (hex) --      file whose content is the following hex bytes
  -- path -> target --  symlink
Run: python3 gen.py  (rewrites the .tree files next to it)
"""
import os, struct

def cpuinfo(model, sockets, cores, threads_per_core, flags, mhz="2100.000"):
    out, n = [], 0
    for s in range(sockets):
        for c in range(cores):
            for t in range(threads_per_core):
                out.append("\n".join([
                    f"processor\t: {n}", "vendor_id\t: " + ("AuthenticAMD" if "svm" in flags else "GenuineIntel"),
                    f"model name\t: {model}", f"cpu MHz\t\t: {mhz}", f"physical id\t: {s}",
                    f"siblings\t: {cores*threads_per_core}", f"core id\t\t: {c}", f"cpu cores\t: {cores}",
                    f"apicid\t\t: {n}", f"flags\t\t: {flags}", ""]))
                n += 1
    return "\n".join(out) + "\n", n

def dimm(handle, locator, size_mb, mtype, speed, manuf, serial, part):
    strs = [locator, "BANK 0", manuf, serial, "Not Specified", part]
    s = lambda i: i
    body = struct.pack("<BBH", 17, 0x28, handle)
    body += struct.pack("<HHHHH", 0x1000, 0xFFFE, 72, 64, size_mb if size_mb < 0x7FFF else 0x7FFF)
    body += struct.pack("<BBBBBH", 0x09, 0, 1, 2, mtype, 0x0080)
    body += struct.pack("<H", speed)
    body += bytes([3, 4, 5, 6])  # manufacturer, serial, asset, part
    body += bytes([2])  # attributes
    body += struct.pack("<I", size_mb if size_mb >= 0x7FFF else 0)
    body += struct.pack("<HHHH", speed, 1200, 1200, 1200)
    assert len(body) == 0x28, len(body)
    return body + b"\0".join(x.encode() for x in strs) + b"\0\0"

def empty_slot(handle, locator):
    body = struct.pack("<BBH", 17, 0x28, handle) + struct.pack("<HHHHH", 0x1000, 0xFFFE, 0xFFFF, 0xFFFF, 0)
    body += struct.pack("<BBBBBH", 0x09, 0, 3, 0, 0x02, 0x0000) + struct.pack("<H", 0) + bytes([0, 0, 0, 0, 0]) + bytes(4) + bytes(8)
    return body + locator.encode() + b"\0\0"

def processor(handle, socket, manuf, version, family, family2=0, status=0x41, cores=1, threads=1):
    """SMBIOS type 4 Processor Information (DSP0134 3.x 7.5), SMBIOS 3.0 layout (length 30h).
    status 0x41: bit 6 CPU Socket Populated, bits 2:0 = 1 CPU Enabled."""
    body = struct.pack("<BBH", 4, 0x30, handle)
    body += bytes([1, 0x03, family, 2])           # socket string, Central Processor, Processor Family, manufacturer string
    body += bytes(8)                              # Processor ID (CPUID signature and feature flags, not read)
    body += bytes([3, 0x80 | 12])                 # version string, voltage (1.2 V)
    body += struct.pack("<HHH", 100, 4800, 3400)  # external clock, max speed, current speed (MHz)
    body += bytes([status, 0x01])                 # status, upgrade (Other)
    body += struct.pack("<HHH", 0xFFFF, 0xFFFF, 0xFFFF)  # L1, L2, L3 cache handles
    body += bytes([0, 0, 0, cores, cores, threads])      # serial, asset tag, part number strings; core/enabled/thread counts
    body += struct.pack("<HH", 0x00FC, family2)   # characteristics (64-bit capable, multi-core...), Processor Family 2
    body += struct.pack("<HHH", cores, cores, threads)   # Core Count 2, Core Enabled 2, Thread Count 2
    assert len(body) == 0x30, len(body)
    return body + b"\0".join(x.encode() for x in [socket, manuf, version]) + b"\0\0"

class Tree:
    def __init__(self, header):
        self.parts = [header]
    def f(self, path, content):
        if not content.endswith("\n"): content += "\n"
        self.parts.append(f"-- {path} --\n{content}")
    def hex(self, path, data):
        h = data.hex()
        self.parts.append(f"-- {path} (hex) --\n" + "\n".join(h[i:i+64] for i in range(0, len(h), 64)) + "\n")
    def link(self, path, target):
        self.parts.append(f"-- {path} -> {target} --\n")
    def write(self, name):
        open(os.path.join(os.path.dirname(os.path.abspath(__file__)), name), "w").write("".join(self.parts))

def rel(frm, to):
    return os.path.relpath(to, os.path.dirname(frm))

def block(t, name, devpath, size_bytes, rot, ro="0", removable="0", devfiles=None, blockfiles=None, devlink_rel=None):
    """devpath: sys/devices/... path of the block device directory."""
    t.link(f"sys/block/{name}", rel(f"sys/block/{name}", devpath))
    t.f(f"{devpath}/size", str(size_bytes // 512))
    t.f(f"{devpath}/ro", ro)
    t.f(f"{devpath}/removable", removable)
    t.f(f"{devpath}/queue/rotational", rot)
    for k, v in (blockfiles or {}).items():
        t.f(f"{devpath}/{k}", v)
    if devfiles is not None:
        devdir = os.path.normpath(os.path.join(devpath, devlink_rel))
        t.link(f"{devpath}/device", rel(f"{devpath}/device", devdir))
        for k, v in devfiles.items():
            if isinstance(v, bytes):
                t.hex(f"{devdir}/{k}", v)
            else:
                t.f(f"{devdir}/{k}", v)

def nic(t, name, pcipath, mac, driver, oper, carrier, speed):
    t.f(f"{pcipath}/vendor", "0x8086")
    t.link(f"{pcipath}/driver", f"../../../bus/pci/drivers/{driver}" if pcipath.count("/") == 3 else f"../../../../bus/pci/drivers/{driver}")
    d = f"sys/class/net/{name}"
    t.link(f"{d}/device", rel(f"{d}/device", pcipath))
    t.f(f"{d}/address", mac)
    t.f(f"{d}/operstate", oper)
    t.f(f"{d}/carrier", carrier)
    t.f(f"{d}/speed", speed)

def virtnet(t, name, mac):
    d = f"sys/class/net/{name}"
    t.f(f"{d}/address", mac)
    t.f(f"{d}/operstate", "unknown")

def dmi(t, **kv):
    for k, v in kv.items():
        t.f(f"sys/class/dmi/id/{k}", v)

def vpd80(serial):
    return bytes([0, 0x80, 0, len(serial)]) + serial.encode()

GiB = 1 << 30
TB = 10**12

# 1. Supermicro 1U, Xeon E-2236, NVMe x2 + SATA HDD, USB stick, BMC virtual media, igb + ixgbe.
t = Tree("# Supermicro SYS-5019C-M: Xeon E-2236 (6c/12t), 2x16 GiB DDR4, 2x NVMe, 1x SATA HDD,\n# a USB stick and the BMC's virtual HDisk; igb x2 + ixgbe; docker0 bridge.\n")
ci, n = cpuinfo("Intel(R) Xeon(R) E-2236 CPU @ 3.40GHz", 1, 6, 2, "fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush dts acpi mmx fxsr sse sse2 ss ht tm pbe syscall nx pdpe1gb rdtscp lm constant_tsc art arch_perfmon pebs bts rep_good nopl xtopology nonstop_tsc cpuid aperfmperf pni pclmulqdq dtes64 monitor ds_cpl vmx smx est tm2 ssse3 sdbg fma cx16 xtpr pdcm pcid sse4_1 sse4_2 x2apic movbe popcnt tsc_deadline_timer aes xsave avx f16c rdrand lahf_lm abm 3dnowprefetch cpuid_fault epb invpcid_single ssbd ibrs ibpb stibp tpr_shadow vnmi flexpriority ept vpid ept_ad fsgsbase tsc_adjust bmi1 avx2 smep bmi2 erms invpcid mpx rdseed adx smap clflushopt intel_pt xsaveopt xsavec xgetbv1 xsaves dtherm ida arat pln pts hwp hwp_notify hwp_act_window hwp_epp md_clear flush_l1d arch_capabilities")
t.f("proc/cpuinfo", ci)
t.f("sys/devices/system/cpu/online", f"0-{n-1}")
t.f("proc/meminfo", "MemTotal:       32617788 kB\nMemFree:        31200000 kB\nMemAvailable:   31500000 kB\n")
t.hex("sys/firmware/dmi/entries/17-0/raw", dimm(0x41, "DIMMA1", 16384, 0x1A, 2666, "Samsung", "41A2B3C4", "M391A2K43DB1-CTD"))
t.hex("sys/firmware/dmi/entries/17-1/raw", empty_slot(0x42, "DIMMA2"))
t.hex("sys/firmware/dmi/entries/17-2/raw", dimm(0x43, "DIMMB1", 16384, 0x1A, 2666, "Samsung", "41A2B3C5", "M391A2K43DB1-CTD"))
t.hex("sys/firmware/dmi/entries/17-3/raw", empty_slot(0x44, "DIMMB2"))
t.hex("sys/firmware/dmi/entries/4-0/raw", processor(0x4B, "CPU", "Intel(R) Corporation", "Intel(R) Xeon(R) E-2236 CPU @ 3.40GHz", 0xB3, 0xB3, cores=6, threads=12))
dmi(t, sys_vendor="Supermicro", product_name="SYS-5019C-M", product_serial="S123456X9A01234",
    product_uuid="00000000-0000-0000-0000-3CECEF123456", board_vendor="Supermicro", board_name="X11SCM-F",
    board_serial="ZM19AS012345", bios_vendor="American Megatrends Inc.", bios_version="1.4", bios_date="10/08/2020")
p = "sys/devices/pci0000:00/0000:00:1d.0/0000:3b:00.0/nvme/nvme0"
block(t, "nvme0n1", p + "/nvme0n1", 960197124096, "0", blockfiles={"wwid": "eui.0025388b91234567"},
      devfiles={"model": "SAMSUNG MZ1LB960HAJQ-00007          ", "serial": "S45NNE0M123456      "}, devlink_rel="../../nvme0")
p = "sys/devices/pci0000:00/0000:00:1d.4/0000:3c:00.0/nvme/nvme1"
block(t, "nvme1n1", p + "/nvme1n1", 1920383410176, "0", blockfiles={"wwid": "eui.0025388b91abcdef"},
      devfiles={"model": "SAMSUNG MZ1LB1T9HALS-00007", "serial": "S436NA0N654321"}, devlink_rel="../../nvme1")
p = "sys/devices/pci0000:00/0000:00:17.0/ata1/host0/target0:0:0/0:0:0:0"
block(t, "sda", p + "/block/sda", 4000787030016, "1",
      devfiles={"vendor": "ATA     ", "model": "ST4000NM0035-1V4", "wwid": "naa.5000c500a1b2c3d4", "vpd_pg80": vpd80("ZC1ABCDE")}, devlink_rel="../..")
p = "sys/devices/pci0000:00/0000:00:14.0/usb1/1-3/1-3:1.0/host6/target6:0:0/6:0:0:0"
block(t, "sdb", p + "/block/sdb", 32010928128, "0", removable="1",
      devfiles={"vendor": "SanDisk ", "model": "Cruzer Blade    ", "vpd_pg80": vpd80("4C530001230815117342")}, devlink_rel="../..")
p = "sys/devices/pci0000:00/0000:00:14.0/usb1/1-4/1-4:1.0/host7/target7:0:0/7:0:0:0"
block(t, "sdc", p + "/block/sdc", 1474560, "0",
      devfiles={"vendor": "AMI     ", "model": "Virtual HDisk0  "}, devlink_rel="../..")
t.link("sys/block/loop0", "../devices/virtual/block/loop0")
t.f("sys/devices/virtual/block/loop0/size", "0")
nic(t, "eno1", "sys/devices/pci0000:00/0000:00:1c.0/0000:01:00.0", "3c:ec:ef:12:34:56", "igb", "up", "1", "1000")
nic(t, "eno2", "sys/devices/pci0000:00/0000:00:1c.1/0000:02:00.0", "3c:ec:ef:12:34:57", "igb", "down", "0", "-1")
nic(t, "enp1s0f0", "sys/devices/pci0000:00/0000:00:01.0/0000:05:00.0", "a0:36:9f:aa:bb:cc", "ixgbe", "up", "1", "10000")
virtnet(t, "lo", "00:00:00:00:00:00")
virtnet(t, "docker0", "02:42:ac:11:00:01")
t.write("supermicro-nvme-sata.tree")

# 2. Dual-socket AMD EPYC, no DMI exported, NVMe + MegaRAID virtual drive, mlx5 25G.
t = Tree("# Dual AMD EPYC 7252 (2 sockets, small topology), no DMI in sysfs (as on some ARM/OEM\n# firmware and containers), 1x NVMe, 1x MegaRAID virtual drive, mlx5 2x25G.\n")
ci, n = cpuinfo("AMD EPYC 7252 8-Core Processor", 2, 4, 2, "fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr sse sse2 ht syscall nx mmxext fxsr_opt pdpe1gb rdtscp lm constant_tsc rep_good nopl nonstop_tsc cpuid extd_apicid aperfmperf rapl pni pclmulqdq monitor ssse3 fma cx16 sse4_1 sse4_2 movbe popcnt aes xsave avx f16c rdrand lahf_lm cmp_legacy svm extapic cr8_legacy abm sse4a misalignsse 3dnowprefetch osvw ibs skinit wdt tce topoext perfctr_core perfctr_nb bpext perfctr_llc mwaitx cpb cat_l3 cdp_l3 hw_pstate ssbd mba ibrs ibpb stibp vmmcall fsgsbase bmi1 avx2 smep bmi2 cqm rdt_a rdseed adx smap clflushopt clwb sha_ni xsaveopt xsavec xgetbv1 xsaves cqm_llc cqm_occup_llc cqm_mbm_total cqm_mbm_local clzero irperf xsaveerptr rdpru wbnoinvd amd_ppin arat npt lbrv svm_lock nrip_save tsc_scale vmcb_clean flushbyasid decodeassists pausefilter pfthreshold avic v_vmsave_vmload vgif v_spec_ctrl umip rdpid overflow_recov succor smca sme sev sev_es", "3100.000")
t.f("proc/cpuinfo", ci)
t.f("sys/devices/system/cpu/online", f"0-{n-1}")
t.f("proc/meminfo", "MemTotal:       263842012 kB\nMemFree:        260000000 kB\n")
p = "sys/devices/pci0000:40/0000:40:03.1/0000:41:00.0/nvme/nvme0"
block(t, "nvme0n1", p + "/nvme0n1", 3840755982336, "0", blockfiles={"wwid": "nvme.1344-3230323130303030-4d4943524f4e-00000001"},
      devfiles={"model": "Micron_7300_MTFDHBE3T8TDF", "serial": "2021000000AB"}, devlink_rel="../../nvme0")
p = "sys/devices/pci0000:00/0000:00:03.1/0000:03:00.0/host0/target0:2:0/0:2:0:0"
block(t, "sda", p + "/block/sda", 479559942144, "0",
      devfiles={"vendor": "AVAGO   ", "model": "MR9361-8i       ", "wwid": "naa.600605b00d1e2f3a2a1b2c3d4e5f6071", "vpd_pg80": vpd80("0071605f4e3d2c1b2a3a2f1e0db00506")}, devlink_rel="../..")
nic(t, "ens1f0np0", "sys/devices/pci0000:80/0000:80:01.1/0000:81:00.0", "b8:ce:f6:01:02:03", "mlx5_core", "up", "1", "25000")
nic(t, "ens1f1np1", "sys/devices/pci0000:80/0000:80:01.1/0000:81:00.1", "b8:ce:f6:01:02:04", "mlx5_core", "down", "0", "-1")
virtnet(t, "lo", "00:00:00:00:00:00")
t.write("amd-epyc-nodmi.tree")

# 3. qemu q35 guest as in the lab: 2 vCPUs without vmx, virtio-blk with serial, CD-ROM, virtio-net.
t = Tree("# qemu 7.2 q35 guest (TCG) as used by the VM lab: 2 vCPUs, 1 GiB, virtio-blk vda with a\n# serial, a CD-ROM (sr0), virtio-net.\n")
ci, n = cpuinfo("QEMU Virtual CPU version 2.5+", 1, 1, 1, "fpu de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr sse sse2 syscall nx lm rep_good nopl xtopology cpuid tsc_known_freq pni cx16 x2apic hypervisor lahf_lm cpuid_fault pti")
ci2, _ = cpuinfo("QEMU Virtual CPU version 2.5+", 1, 1, 1, "x")
ci = ci + ci.replace("processor\t: 0", "processor\t: 1").replace("physical id\t: 0", "physical id\t: 1").replace("apicid\t\t: 0", "apicid\t\t: 1")
t.f("proc/cpuinfo", ci)
t.f("sys/devices/system/cpu/online", "0-1")
t.f("proc/meminfo", "MemTotal:        1002148 kB\n")
# QEMU's type 4 per vCPU socket: Processor Family 01h "Other" (its default), which names no arch.
t.hex("sys/firmware/dmi/entries/4-0/raw", processor(0x400, "CPU 0", "QEMU", "pc-q35-7.2", 0x01, 0x01))
t.hex("sys/firmware/dmi/entries/4-1/raw", processor(0x401, "CPU 1", "QEMU", "pc-q35-7.2", 0x01, 0x01))
dmi(t, sys_vendor="QEMU", product_name="Standard PC (Q35 + ICH9, 2009)", product_serial="", product_uuid="6A1F0E3C-1111-4222-8333-444455556666",
    board_vendor="", board_name="", bios_vendor="SeaBIOS", bios_version="1.16.2-debian-1.16.2-1", bios_date="04/01/2014")
p = "sys/devices/pci0000:00/0000:00:04.0/virtio1"
block(t, "vda", p + "/block/vda", 1 * GiB, "1", blockfiles={"serial": "machina-vm0"}, devfiles={"features": "0010"}, devlink_rel="../..")
p = "sys/devices/pci0000:00/0000:00:1f.2/ata2/host1/target1:0:0/1:0:0:0"
block(t, "sr0", p + "/block/sr0", 375808, "1", removable="1", devfiles={"vendor": "QEMU    ", "model": "QEMU DVD-ROM    "}, devlink_rel="../..")
nic(t, "eth0", "sys/devices/pci0000:00/0000:00:03.0/virtio0", "52:54:00:12:34:56", "virtio_net", "up", "1", "-1")
virtnet(t, "lo", "00:00:00:00:00:00")
t.write("qemu-q35.tree")
