package bmcsim

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"
)

// FaultKind selects what an injected [Fault] does to a matching request.
type FaultKind int

// Fault kinds.
const (
	// FaultUnavailable answers 503 with a Redfish error body, and a
	// Retry-After header (whole seconds) when Fault.RetryAfter > 0.
	FaultUnavailable FaultKind = iota + 1
	// FaultBadGateway answers 502.
	FaultBadGateway
	// FaultAccepted performs the request, then answers 202 Accepted with a
	// Location task monitor (DSP0266 §12.2) that reports Running for
	// Fault.TaskPolls polls, then Completed; with Fault.TaskFails the
	// request is not performed and the task ends in Exception.
	FaultAccepted
	// FaultSlow waits Fault.Delay (or until the client goes away) before
	// handling the request normally.
	FaultSlow
	// FaultDrop closes the TCP connection without an answer; the request
	// is not performed.
	FaultDrop
	// FaultDropAfter performs the request, then closes the connection
	// without an answer (the client cannot know it was applied).
	FaultDropAfter
	// FaultExpireSession invalidates every session before handling the
	// request, so a token-authenticated request gets 401.
	FaultExpireSession
)

// Fault is an injected failure for requests matching Method and PathSuffix.
type Fault struct {
	// Method matches the HTTP method; "" matches any.
	Method string
	// PathSuffix matches the end of the URL path, case-insensitively,
	// e.g. "/Actions/ComputerSystem.Reset"; "" matches any path.
	PathSuffix string
	// Kind is what the fault does.
	Kind FaultKind
	// Times is how many matching requests the fault hits; zero means all.
	Times int
	// RetryAfter is sent with FaultUnavailable; zero omits the header.
	RetryAfter time.Duration
	// Delay is the FaultSlow wait.
	Delay time.Duration
	// TaskPolls is how many task-monitor polls report Running (FaultAccepted).
	TaskPolls int
	// TaskFails makes the FaultAccepted task end in Exception.
	TaskFails bool

	hits int
}

// Inject adds f; faults are checked in the order injected and the first
// match with hits left applies.
func (s *Server) Inject(f Fault) {
	s.mu.Lock()
	s.faults = append(s.faults, &f)
	s.mu.Unlock()
}

// ClearFaults removes every injected fault.
func (s *Server) ClearFaults() {
	s.mu.Lock()
	s.faults = nil
	s.mu.Unlock()
}

func (s *Server) matchFault(r *http.Request) *Fault {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := normPath(r.URL.Path)
	for _, f := range s.faults {
		if f.Method != "" && !strings.EqualFold(f.Method, r.Method) {
			continue
		}
		if f.PathSuffix != "" && !strings.HasSuffix(p, strings.ToLower(strings.TrimRight(f.PathSuffix, "/"))) {
			continue
		}
		if f.Times > 0 && f.hits >= f.Times {
			continue
		}
		f.hits++
		return f
	}
	return nil
}

// task is an emulated long-running operation behind a task monitor.
type task struct {
	id       string
	pollsGot int
	polls    int
	fails    bool
	message  string
}

// accept performs the request (unless the task is to fail) and answers 202
// with a task monitor.
func (s *Server) accept(w http.ResponseWriter, r *http.Request, f *Fault, decoded map[string]any) {
	t := &task{polls: f.TaskPolls, fails: f.TaskFails}
	if !f.TaskFails {
		rec := httptest.NewRecorder()
		s.serve(s.recorder(rec, r, decoded), r, decoded)
		if rec.Code >= 300 {
			for k, v := range rec.Header() {
				w.Header()[k] = v
			}
			w.WriteHeader(rec.Code)
			_, _ = w.Write(rec.Body.Bytes())
			return
		}
		t.message = "The task completed successfully."
	} else {
		auth, ok, status := s.authenticate(r)
		if !ok {
			rw := s.recorder(w, r, decoded)
			rw.auth = auth
			writeError(rw, status, "Base.1.8.InsufficientPrivilege", "There are insufficient privileges for the account or credentials associated with the current session to perform the requested operation.")
			return
		}
		s.record(r, decoded, auth, http.StatusAccepted)
		t.message = "The operation failed in the emulated task."
	}
	s.mu.Lock()
	s.seq++
	t.id = fmt.Sprintf("sim%d", s.seq)
	s.tasks[t.id] = t
	s.mu.Unlock()
	w.Header().Set("Location", "/redfish/v1/TaskService/TaskMonitors/"+t.id)
	writeJSON(w, http.StatusAccepted, s.taskBody(t, "Running"))
}

func (s *Server) taskBody(t *task, state string) map[string]any {
	status := "OK"
	msgs := []any{}
	if state == "Exception" {
		status = "Critical"
	}
	if state != "Running" {
		msgs = append(msgs, map[string]any{"MessageId": "TaskEvent.1.0.TaskCompletedOK", "Message": t.message})
	}
	return map[string]any{
		"@odata.id":   "/redfish/v1/TaskService/Tasks/" + t.id,
		"@odata.type": "#Task.v1_4_3.Task",
		"Id":          t.id, "Name": "Task " + t.id,
		"TaskState": state, "TaskStatus": status,
		"TaskMonitor": "/redfish/v1/TaskService/TaskMonitors/" + t.id,
		"Messages":    msgs,
	}
}

// serveTask answers GETs on task monitors and tasks it created.
func (s *Server) serveTask(w http.ResponseWriter, p string) (int, bool) {
	var id string
	var monitor bool
	switch {
	case strings.HasPrefix(p, "/redfish/v1/taskservice/taskmonitors/"):
		id, monitor = strings.TrimPrefix(p, "/redfish/v1/taskservice/taskmonitors/"), true
	case strings.HasPrefix(p, "/redfish/v1/taskservice/tasks/sim"):
		id = strings.TrimPrefix(p, "/redfish/v1/taskservice/tasks/")
	default:
		return 0, false
	}
	s.mu.Lock()
	t, ok := s.tasks[id]
	state := "Running"
	if ok {
		if t.pollsGot >= t.polls {
			state = "Completed"
			if t.fails {
				state = "Exception"
			}
		}
		t.pollsGot++
	}
	s.mu.Unlock()
	if !ok {
		return writeError(w, http.StatusNotFound, "Base.1.8.ResourceMissingAtURI", "No such task."), true
	}
	code := http.StatusOK
	if monitor && state == "Running" {
		code = http.StatusAccepted
	}
	return writeJSON(w, code, s.taskBody(t, state)), true
}
