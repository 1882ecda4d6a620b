package tftp

import (
	"errors"
	"fmt"
	"net/netip"
	"time"

	"golang.org/x/sys/unix"
)

// loop is the server's event loop, dnsmasq's design with epoll instead of
// poll: one goroutine waits on one epoll instance holding the listen
// socket, an eventfd for shutdown and every transfer's socket; a ready
// socket's ACK is read and the next block sent in the same pass, with no
// goroutine handoff per packet. Retransmission timers are a list ordered
// by due time: every transfer's timeout is the same, so a transfer
// rescheduled to now+Timeout always goes to the tail.
type loop struct {
	s                *Server
	ep, wake, listen int
	byFD             map[int32]*transfer // running transfers
	pending          []*transfer         // accepted, waiting for a running slot, from pending[next] on
	next             int
	head, tail       *transfer
	now              time.Time
	accepting        bool
	graceEnd         time.Time
	events           []unix.EpollEvent
	buf              []byte
	timeout          time.Duration
	retries          int
}

// errShutdown ends the transfers still running when the drain runs out.
var errShutdown = errors.New("server shutting down")

func newLoop(s *Server) (*loop, error) {
	l := &loop{s: s, ep: -1, wake: -1, byFD: map[int32]*transfer{}, accepting: true,
		events: make([]unix.EpollEvent, 1024), buf: make([]byte, 65536), timeout: s.cfg.Timeout, retries: s.cfg.Retries}
	rc, err := s.conn.SyscallConn()
	if err != nil {
		return nil, err
	}
	// The listen socket's descriptor stays valid until Serve closes s.conn
	// after the loop ends; it is already non-blocking (Go's netpoller).
	if err := rc.Control(func(fd uintptr) { l.listen = int(fd) }); err != nil {
		return nil, err
	}
	if l.ep, err = unix.EpollCreate1(unix.EPOLL_CLOEXEC); err != nil {
		return nil, fmt.Errorf("epoll: %w", err)
	}
	if l.wake, err = unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC); err != nil {
		l.close()
		return nil, fmt.Errorf("eventfd: %w", err)
	}
	for _, fd := range []int{l.listen, l.wake} {
		if err := l.watch(fd); err != nil {
			l.close()
			return nil, err
		}
	}
	return l, nil
}

func (l *loop) watch(fd int) error {
	if err := unix.EpollCtl(l.ep, unix.EPOLL_CTL_ADD, fd, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(fd)}); err != nil {
		return fmt.Errorf("epoll add: %w", err)
	}
	return nil
}

// shutdown wakes the loop to stop accepting; safe from any goroutine.
func (l *loop) shutdown() {
	var one = [8]byte{1}
	_, _ = unix.Write(l.wake, one[:])
}

func (l *loop) close() {
	if l.wake >= 0 {
		unix.Close(l.wake)
	}
	if l.ep >= 0 {
		unix.Close(l.ep)
	}
}

// run serves until shutdown and the drain are over. Errors: epoll_wait or
// the listen socket failing.
func (l *loop) run() error {
	for {
		if !l.accepting && (len(l.byFD)+len(l.pending)-l.next == 0 || !l.now.Before(l.graceEnd)) {
			for _, t := range l.byFD {
				l.finish(t, errShutdown)
			}
			for _, t := range l.pending[l.next:] {
				l.s.end(t, errShutdown)
			}
			return nil
		}
		n, err := unix.EpollWait(l.ep, l.events, l.waitMillis())
		if err != nil && !errors.Is(err, unix.EINTR) {
			return fmt.Errorf("epoll wait: %w", err)
		}
		l.now = time.Now()
		for _, ev := range l.events[:max(n, 0)] {
			switch fd := int(ev.Fd); fd {
			case l.wake:
				var b [8]byte
				_, _ = unix.Read(l.wake, b[:])
				if l.accepting {
					l.accepting = false
					l.graceEnd = l.now.Add(l.timeout * time.Duration(l.retries))
					_ = unix.EpollCtl(l.ep, unix.EPOLL_CTL_DEL, l.listen, nil)
				}
			case l.listen:
				if err := l.accept(); err != nil {
					return err
				}
			default:
				l.ready(fd)
			}
		}
		for l.head != nil && !l.head.due.After(l.now) {
			t := l.head
			if err := t.onTimeout(l.retries); err != nil {
				l.finish(t, err)
				continue
			}
			l.schedule(t)
		}
		l.admit()
	}
}

// waitMillis is epoll_wait's timeout: until the first retransmission or
// the end of the drain, rounded up to whole milliseconds; -1 when idle.
func (l *loop) waitMillis() int {
	var until time.Time
	if l.head != nil {
		until = l.head.due
	}
	if l.next < len(l.pending) && (until.IsZero() || l.pending[l.next].due.Before(until)) {
		until = l.pending[l.next].due
	}
	if !l.accepting && (until.IsZero() || l.graceEnd.Before(until)) {
		until = l.graceEnd
	}
	if until.IsZero() {
		return -1
	}
	d := time.Until(until)
	if d <= 0 {
		return 0
	}
	return int((d + time.Millisecond - 1) / time.Millisecond)
}

// accept reads up to 64 queued requests from the listen socket; a request
// beyond MaxActive running transfers waits in pending (first come, first
// served) instead of sharing the CPU with all the others: in a storm the
// first requests finish first, rather than every transfer finishing near
// the end.
func (l *loop) accept() error {
	for range 64 {
		n, from, err := unix.Recvfrom(l.listen, l.buf[:maxRequest+1], unix.MSG_DONTWAIT)
		switch {
		case errors.Is(err, unix.EAGAIN), errors.Is(err, unix.EINTR):
			return nil
		case err != nil:
			return fmt.Errorf("read request: %w", err)
		}
		sa, ok := from.(*unix.SockaddrInet4)
		if !ok {
			continue
		}
		if t := l.s.handle(l.buf[:n], netip.AddrPortFrom(netip.AddrFrom4(sa.Addr), uint16(sa.Port))); t != nil {
			t.due = l.now.Add(l.timeout) // start by then whatever runs
			l.pending = append(l.pending, t)
		}
	}
	return nil
}

// admit starts pending transfers while fewer than MaxActive run, and
// those that have waited for Timeout whatever runs: a client whose request
// goes unanswered resends it after its own timeout and gives up after a
// few (the pin/tftp client after 5 s, iPXE and EDK2 after some more), so
// a request never waits longer than one retransmission timeout. Beyond
// that, a storm of large files shares the CPU among all its transfers.
func (l *loop) admit() {
	for l.next < len(l.pending) && (len(l.byFD) < l.s.cfg.MaxActive || !l.pending[l.next].due.After(l.now)) {
		t := l.pending[l.next]
		l.pending[l.next] = nil
		l.next++
		if err := l.watch(t.fd); err != nil {
			l.s.end(t, err)
			continue
		}
		l.byFD[int32(t.fd)] = t
		if err := t.start(); err != nil {
			l.finish(t, err)
			continue
		}
		l.schedule(t)
	}
	if l.next == len(l.pending) {
		l.pending, l.next = l.pending[:0], 0
	}
}

// ready reads one datagram from a transfer's socket and acts on it.
func (l *loop) ready(fd int) {
	t := l.byFD[int32(fd)]
	if t == nil {
		return
	}
	n, err := unix.Read(fd, l.buf)
	switch {
	case errors.Is(err, unix.EAGAIN), errors.Is(err, unix.EINTR):
		return
	case err != nil: // ECONNREFUSED: ICMP port unreachable, the client is gone
		l.finish(t, fmt.Errorf("receive: %w", err))
		return
	}
	sent := t.sent + boolInt(t.negotiating)
	done, err := t.onPacket(l.buf[:n])
	switch {
	case err != nil:
		l.finish(t, err)
	case done:
		l.finish(t, nil)
	case t.sent+boolInt(t.negotiating) != sent: // progress: a new window went out
		l.schedule(t)
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// schedule (re)arms t's retransmission timer at now+Timeout: t moves to
// the tail of the list.
func (l *loop) schedule(t *transfer) {
	l.unlink(t)
	t.due = l.now.Add(l.timeout)
	t.prev = l.tail
	if l.tail != nil {
		l.tail.next = t
	} else {
		l.head = t
	}
	l.tail = t
}

func (l *loop) unlink(t *transfer) {
	if t.prev != nil {
		t.prev.next = t.next
	} else if l.head == t {
		l.head = t.next
	}
	if t.next != nil {
		t.next.prev = t.prev
	} else if l.tail == t {
		l.tail = t.prev
	}
	t.prev, t.next = nil, nil
}

// finish ends t: off the timer list and epoll (closing its socket), then
// counted by the server.
func (l *loop) finish(t *transfer, err error) {
	l.unlink(t)
	delete(l.byFD, int32(t.fd))
	l.s.end(t, err)
}
