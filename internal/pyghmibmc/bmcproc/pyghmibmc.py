#!/usr/bin/python3
"""A test BMC on pyghmi's pyghmi.ipmi.bmc.Bmc class (Debian python3-pyghmi).

It behaves as VirtualBMC does, which builds on the same class: the boot
flags (System Boot Options parameter 5) keep only the device selector,
the persistent and EFI bits read back cleared (pyghmi answers 0x80), and
pyghmi's RMCP+ server answers every Open Session Request with the
algorithms of cipher suite 3 (RAKP-HMAC-SHA1, HMAC-SHA1-96, AES-CBC-128)
whatever suite the console asked for.

With --apply-at-power-on the boot device also behaves as VirtualBMC over
libvirt: a new device is defined for the next start of the machine, and
read back (Get System Boot Options) as the device of the running machine
until the machine is powered on from off; a reset does not apply it.

Power is kept by a pluggable backend:
  file:PATH        PATH holds "on" or "off" (the tests' backend);
  chassis:COMMAND  an ipmi_sim chassis_control program (COMMAND split into
                   words as a shell would, e.g. the VM lab's
                   "lab-chassis-control VMDIR"), which also takes the boot
                   device: handed over on every change, or with
                   --apply-at-power-on just before each power-on from off.
Every power-on and reset appends "power-on DEVICE" or "reset DEVICE" to
--boots, the device in effect for that boot.

The password is read from the first line of standard input, never argv.
The bound port is printed as "listening PORT" once the socket is bound.
"""

import argparse
import shlex
import subprocess
import sys

import pyghmi.ipmi.bmc as bmc


class FileBackend(object):
    def __init__(self, path):
        self.path = path

    def state(self):
        try:
            with open(self.path) as f:
                return f.read().strip() or 'off'
        except FileNotFoundError:
            return 'off'

    def set(self, on):
        with open(self.path, 'w') as f:
            f.write('on\n' if on else 'off\n')

    def shutdown(self):
        self.set(False)

    def reset(self):
        pass

    def boot(self, device):
        pass


class ChassisBackend(object):
    """Power and boot device through an ipmi_sim chassis_control program.

    The VM lab's lab-chassis-control (lab/vm/ipmichassis over
    lab/vm/vmpower) is the program ipmi_sim runs for its VM: the same Go
    code, QMP client and qemu boot order serve both BMCs, and this script
    needs no QMP client of its own. Protocol (ipmi_sim's extcmd.c):
    `CMD get power` prints "power:0|1"; `CMD set power 1|0`,
    `CMD set reset 1`, `CMD set shutdown 1`, `CMD set boot
    pxe|default|cdrom`. vmpower fixes the boot order at qemu's start, so
    a device set here applies at the next power-on.
    """

    # pyghmi device names -> chassis_control boot values
    BOOT = {'network': 'pxe', 'optical': 'cdrom', 'hd': 'default', 'default': 'default'}

    def __init__(self, cmd):
        self.cmd = shlex.split(cmd)

    def _run(self, *args):
        r = subprocess.run(self.cmd + list(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           stdin=subprocess.DEVNULL, timeout=60, universal_newlines=True)
        if r.returncode != 0:
            raise RuntimeError('chassis_control %s: %s' % (' '.join(args), r.stderr.strip()))
        return r.stdout

    def state(self):
        for line in self._run('get', 'power').splitlines():
            if line.strip() == 'power:1':
                return 'on'
        return 'off'

    def set(self, on):
        self._run('set', 'power', '1' if on else '0')

    def shutdown(self):
        self._run('set', 'shutdown', '1')

    def reset(self):
        self._run('set', 'reset', '1')

    def boot(self, device):
        self._run('set', 'boot', self.BOOT.get(device, 'default'))


def backend(spec):
    kind, _, arg = spec.partition(':')
    if kind == 'file':
        return FileBackend(arg)
    if kind == 'chassis':
        return ChassisBackend(arg)
    raise SystemExit('unknown power backend %r (want file:PATH or chassis:COMMAND)' % spec)


class TestBMC(bmc.Bmc):
    def __init__(self, authdata, port, address, power, boots, at_power_on):
        super(TestBMC, self).__init__(authdata, port=port, address=address)
        self.power = power
        self.boots = boots
        self.at_power_on = at_power_on
        self.defined = 'default'   # the device set for the next boot
        self.running = 'default'   # the device the running machine booted with

    def _boot(self, how):
        if self.boots:
            with open(self.boots, 'a') as f:
                f.write('%s %s\n' % (how, self.defined if how == 'power-on' or not self.at_power_on else self.running))

    def get_boot_device(self):
        if self.at_power_on and self.power.state() == 'on':
            return self.running
        return self.defined

    def set_boot_device(self, bootdevice):
        # VirtualBMC keeps the device only: no persistent, no EFI bit.
        self.defined = bootdevice
        if not self.at_power_on:
            self.power.boot(bootdevice)

    def get_power_state(self):
        return self.power.state()

    def power_on(self):
        if self.power.state() == 'off':
            self.running = self.defined
            if self.at_power_on:
                self.power.boot(self.defined)  # libvirt starts the domain as defined
            self.power.set(True)
            self._boot('power-on')

    def power_off(self):
        self.power.set(False)

    def power_shutdown(self):
        self.power.shutdown()

    def power_cycle(self):
        self.power_off()
        self.power_on()

    def power_reset(self):
        if self.power.state() == 'off':
            return 0xd5  # not in present state, as VirtualBMC answers
        self.power.reset()
        self._boot('reset')


def main():
    p = argparse.ArgumentParser()
    p.add_argument('--address', default='127.0.0.1')
    p.add_argument('--port', type=int, default=0)
    p.add_argument('--user', default='admin')
    p.add_argument('--power', required=True, help='file:PATH or chassis:COMMAND')
    p.add_argument('--boots', default='')
    p.add_argument('--apply-at-power-on', action='store_true')
    a = p.parse_args()
    password = sys.stdin.readline().rstrip('\n')
    b = TestBMC({a.user: password}, a.port, a.address, backend(a.power), a.boots, a.apply_at_power_on)
    print('listening %d' % b.serversocket.getsockname()[1], flush=True)
    b.listen()


if __name__ == '__main__':
    main()
