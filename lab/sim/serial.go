package sim

import (
	"context"
	"net"
	"sync"
)

// serialPort is the serial line (ttyS0) of a simulated IPMI machine, the
// far end of its BMC's Serial-over-LAN: ipmi_sim connects to it over TCP
// (lan.conf `sol "tcp:ADDR" 115200`), what the machine writes on its
// console goes to whoever holds the SOL session, and what the SOL session
// sends is the machine's keyboard input. It is a real byte stream; the
// machine decides what its console prints and whether it reads input (see
// Machine.serialInput).
type serialPort struct {
	ln  net.Listener
	out chan []byte // console output, in order; a full buffer drops (a UART overrun)

	mu       sync.Mutex
	conn     net.Conn // ipmi_sim's current connection; nil before it connects
	received []byte   // the last serialKeep bytes of input, for tests
}

// serialKeep bounds the input transcript a serial port keeps.
const serialKeep = 4096

// startSerial opens m's serial port on 127.0.0.1:0 and serves it until ctx
// ends (goroutines counted in wg). It returns the address for ipmi_sim.
func (m *Machine) startSerial(ctx context.Context, wg *sync.WaitGroup) (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	p := &serialPort{ln: ln, out: make(chan []byte, 256)}
	m.mu.Lock()
	m.serial = p
	m.mu.Unlock()
	wg.Add(3)
	go func() {
		defer wg.Done()
		<-ctx.Done()
		ln.Close()
		p.mu.Lock()
		if p.conn != nil {
			p.conn.Close()
		}
		p.mu.Unlock()
	}()
	go func() {
		defer wg.Done()
		p.writeLoop(ctx)
	}()
	go func() {
		defer wg.Done()
		p.acceptLoop(ctx, m)
	}()
	return ln.Addr().String(), nil
}

// acceptLoop takes ipmi_sim's connections (it connects at start and again
// after a failure); a new one replaces the old, as one cable does.
func (p *serialPort) acceptLoop(ctx context.Context, m *Machine) {
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if ctx.Err() != nil {
			p.mu.Unlock()
			c.Close()
			return
		}
		if p.conn != nil {
			p.conn.Close()
		}
		p.conn = c
		p.mu.Unlock()
		m.log.Debug("serial console connected", "bmc", c.RemoteAddr().String())
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 512)
			for {
				n, err := c.Read(buf)
				if n > 0 {
					m.serialInput(buf[:n])
					p.record(buf[:n]) // after: a test seeing it knows the machine read it
				}
				if err != nil {
					return
				}
			}
		}()
	}
}

// writeLoop sends the console output to the connected BMC; output while
// nothing is connected is lost, as on a cable nobody listens to.
func (p *serialPort) writeLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case b := <-p.out:
			p.mu.Lock()
			c := p.conn
			p.mu.Unlock()
			if c != nil {
				_, _ = c.Write(b)
			}
		}
	}
}

// write queues console output without blocking.
func (p *serialPort) write(s string) {
	select {
	case p.out <- []byte(s):
	default:
	}
}

// record keeps input bytes for Machine.SerialInput.
func (p *serialPort) record(b []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.received = append(p.received, b...)
	if over := len(p.received) - serialKeep; over > 0 {
		p.received = append([]byte(nil), p.received[over:]...)
	}
}

// SerialInput returns the last bytes (up to 4 KiB) the machine received on
// its serial line through the BMC's Serial-over-LAN, whatever it was doing;
// nil for a machine without a serial console (Redfish BMCs).
func (m *Machine) SerialInput() []byte {
	m.mu.Lock()
	p := m.serial
	m.mu.Unlock()
	if p == nil {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]byte(nil), p.received...)
}

// consoleOut prints s on the machine's serial console, if it has one.
// Callers may hold m.mu.
func (m *Machine) consoleOut(s string) {
	if m.serial != nil {
		m.serial.write(s)
	}
}

// loginPrompt is the getty's prompt of the simulated OS.
func (m *Machine) loginPrompt() string { return m.Name + " login: " }

// osBanner is what the simulated OS prints on ttyS0 once it has booted:
// the getty's issue line and prompt.
func (m *Machine) osBanner() string {
	return "\r\nMachina simulated OS " + m.Name + " ttyS0\r\n\r\n" + m.loginPrompt()
}

// serialInput is the machine reading its serial line. Only the booted OS
// reads it: a getty on a terminal in canonical mode with echo on (termios
// ICRNL and ONLCR: a typed CR echoes as CR LF; DEL erases a character).
// Each line entered is a login name nobody can log in with: a non-empty one
// gets "Login incorrect", and the prompt comes again. Powered off, in
// firmware or in the ramdisk nothing reads the line and input is lost.
func (m *Machine) serialInput(b []byte) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.on || m.phase != PhaseOS {
		m.ttyLine = m.ttyLine[:0]
		return
	}
	var out []byte
	for _, c := range b {
		switch c {
		case '\r', '\n':
			out = append(out, "\r\n"...)
			if len(m.ttyLine) > 0 {
				out = append(out, "Login incorrect\r\n\r\n"...)
			}
			out = append(out, m.loginPrompt()...)
			m.ttyLine = m.ttyLine[:0]
		case 0x7f, '\b':
			if len(m.ttyLine) > 0 {
				m.ttyLine = m.ttyLine[:len(m.ttyLine)-1]
				out = append(out, "\b \b"...)
			}
		default:
			if c < 0x20 {
				continue // other control characters: not echoed here
			}
			if len(m.ttyLine) < 255 { // a full line takes no more and echoes nothing
				m.ttyLine = append(m.ttyLine, c)
				out = append(out, c)
			}
		}
	}
	if len(out) > 0 {
		m.consoleOut(string(out))
	}
}
