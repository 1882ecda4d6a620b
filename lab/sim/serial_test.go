package sim

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestSerialPortIsATerminal plays ipmi_sim on the machine's serial port
// over TCP: powered off nothing answers and input is lost; in the ramdisk
// its line is printed and input is lost; once the OS is up the getty's
// banner arrives and typed bytes echo (CR as CR LF, DEL erasing), a line
// gets "Login incorrect" and a new prompt; a second connection (ipmi_sim
// reconnecting) takes over from the first; powering off prints Linux's
// last line.
func TestSerialPortIsATerminal(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	m := &Machine{Name: "r9-n01", MAC: "52:54:00:00:00:01", log: slog.New(slog.DiscardHandler), phase: PhaseOff}
	addr, err := m.startSerial(ctx, &wg)
	if err != nil {
		t.Fatal(err)
	}
	bmc := dialSerial(t, addr, m)
	rd := bufio.NewReader(bmc)

	// Off: input is recorded on the line but nobody reads or echoes it.
	if _, err := bmc.Write([]byte("lost\r")); err != nil {
		t.Fatal(err)
	}
	waitInput(t, m, "lost\r")

	// Powered on, the ramdisk prints its line and reads nothing.
	m.mu.Lock()
	m.on, m.gen = true, 1
	m.mu.Unlock()
	m.setPhase(1, PhaseCommissioning)
	expect(t, rd, "machina ramdisk: commissioning\r\n")
	if _, err := bmc.Write([]byte("ignored")); err != nil {
		t.Fatal(err)
	}
	waitInput(t, m, "ignored")

	// The OS boots: banner and prompt (nothing of the input before).
	if !m.setPhase(1, PhaseOS) {
		t.Fatal("setPhase refused the current generation")
	}
	want := "\r\nMachina simulated OS r9-n01 ttyS0\r\n\r\nr9-n01 login: "
	expect(t, rd, want)

	// Echo with the line discipline; DEL erases "x".
	if _, err := bmc.Write([]byte("rootx\x7f\r")); err != nil {
		t.Fatal(err)
	}
	expect(t, rd, "rootx\b \b\r\nLogin incorrect\r\n\r\nr9-n01 login: ")
	if _, err := bmc.Write([]byte("\r")); err != nil {
		t.Fatal(err)
	}
	expect(t, rd, "\r\nr9-n01 login: ")

	// ipmi_sim reconnects: the new connection is the line.
	bmc2 := dialSerial(t, addr, m)
	if _, err := bmc.Read(make([]byte, 1)); err == nil {
		t.Error("the first connection stayed open after the second took over")
	}
	if _, err := bmc2.Write([]byte("hi")); err != nil {
		t.Fatal(err)
	}
	rd2 := bufio.NewReader(bmc2)
	expect(t, rd2, "hi")
	if got := string(m.SerialInput()); got != "lost\rignoredrootx\x7f\r\rhi" {
		t.Errorf("SerialInput = %q", got)
	}

	// The OS powers off: Linux's last line.
	m.powerOffFrom(ctx, 1)
	expect(t, rd2, "reboot: Power down\r\n")
}

// dialSerial connects to the serial port as ipmi_sim does and waits until
// the port took the connection (its input arrives).
func dialSerial(t *testing.T, addr string, m *Machine) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	// Wait until acceptLoop made c the current connection.
	deadline := time.Now().Add(10 * time.Second)
	for {
		m.serial.mu.Lock()
		ok := m.serial.conn != nil && m.serial.conn.RemoteAddr().String() == c.LocalAddr().String()
		m.serial.mu.Unlock()
		if ok {
			return c
		}
		if time.Now().After(deadline) {
			t.Fatal("the serial port did not take the connection")
		}
		time.Sleep(5 * time.Millisecond) // polling the port's state
	}
}

// waitInput waits until the machine's serial line received want.
func waitInput(t *testing.T, m *Machine, want string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.HasSuffix(string(m.SerialInput()), want) {
		if time.Now().After(deadline) {
			t.Fatalf("serial input %q, want suffix %q", m.SerialInput(), want)
		}
		time.Sleep(5 * time.Millisecond) // polling the port's state
	}
}

// expect reads exactly len(want) bytes and compares.
func expect(t *testing.T, r io.Reader, want string) {
	t.Helper()
	got := make([]byte, len(want))
	if _, err := io.ReadFull(r, got); err != nil {
		t.Fatalf("read %q so far, want %q: %v", got, want, err)
	}
	if string(got) != want {
		t.Fatalf("console printed %q, want %q", got, want)
	}
}
