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
  file:PATH   PATH holds "on" or "off" (the tests' backend);
  qmp:SOCKET  a qemu QMP unix socket; qemu runs with -S -no-shutdown, a
              paused machine is off: on is "cont", off "stop" and
              "system_reset", reset "system_reset", status "query-status".
Every power-on and reset appends "power-on DEVICE" or "reset DEVICE" to
--boots, the device in effect for that boot.

The password is read from the first line of standard input, never argv.
The bound port is printed as "listening PORT" once the socket is bound.
"""

import argparse
import json
import socket
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

    def reset(self):
        pass


class QMPBackend(object):
    def __init__(self, path):
        self.path = path

    def _cmd(self, *cmds):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(5)
        s.connect(self.path)
        f = s.makefile('rw')
        try:
            json.loads(f.readline())  # greeting
            out = None
            for c in ('qmp_capabilities',) + cmds:
                f.write(json.dumps({'execute': c}) + '\n')
                f.flush()
                while True:
                    msg = json.loads(f.readline())
                    if 'return' in msg or 'error' in msg:
                        break
                if 'error' in msg:
                    raise RuntimeError('qmp %s: %s' % (c, msg['error']))
                out = msg['return']
            return out
        finally:
            f.close()
            s.close()

    def state(self):
        st = self._cmd('query-status')
        return 'on' if st.get('running') else 'off'

    def set(self, on):
        if on:
            self._cmd('cont')
        else:
            self._cmd('stop', 'system_reset')

    def reset(self):
        self._cmd('system_reset')


def backend(spec):
    kind, _, arg = spec.partition(':')
    if kind == 'file':
        return FileBackend(arg)
    if kind == 'qmp':
        return QMPBackend(arg)
    raise SystemExit('unknown power backend %r (want file:PATH or qmp:SOCKET)' % spec)


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

    def get_power_state(self):
        return self.power.state()

    def power_on(self):
        if self.power.state() == 'off':
            self.running = self.defined
            self.power.set(True)
            self._boot('power-on')

    def power_off(self):
        self.power.set(False)

    def power_shutdown(self):
        self.power.set(False)

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
    p.add_argument('--power', required=True, help='file:PATH or qmp:SOCKET')
    p.add_argument('--boots', default='')
    p.add_argument('--apply-at-power-on', action='store_true')
    a = p.parse_args()
    password = sys.stdin.readline().rstrip('\n')
    b = TestBMC({a.user: password}, a.port, a.address, backend(a.power), a.boots, a.apply_at_power_on)
    print('listening %d' % b.serversocket.getsockname()[1], flush=True)
    b.listen()


if __name__ == '__main__':
    main()
