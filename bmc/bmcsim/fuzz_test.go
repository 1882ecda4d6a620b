package bmcsim_test

import (
	"bytes"
	"net/http/httptest"
	"testing"

	"github.com/machina-metal/machina/bmc/bmcsim"
)

// FuzzServeHTTP sends arbitrary methods, paths and bodies to an emulator
// serving the Supermicro tree; it must answer every one without panicking.
func FuzzServeHTTP(f *testing.F) {
	f.Add("POST", "/redfish/v1/Systems/1/Actions/ComputerSystem.Reset", []byte(`{"ResetType":"On"}`))
	f.Add("PATCH", "/redfish/v1/Systems/1", []byte(`{"Boot":{"BootSourceOverrideTarget":"Pxe","BootSourceOverrideMode":7}}`))
	f.Add("PATCH", "/redfish/v1/Managers/1/VirtualMedia/VirtualMedia1", []byte(`{"Image":null,"Inserted":"no"}`))
	f.Add("POST", "/redfish/v1/Managers/1/VirtualMedia/VirtualMedia1/Actions/VirtualMedia.InsertMedia", []byte(`{"Image":["x"]}`))
	f.Add("POST", "/redfish/v1/SessionService/Sessions", []byte(`{"UserName":1,"Password":null}`))
	f.Add("DELETE", "/redfish/v1/SessionService/Sessions/../../x", []byte(``))
	f.Add("GET", "/redfish/v1/Systems/1?$expand=*", []byte(`[]`))
	tr := tree(f, "supermicro-sys821ge-tnhr-x13")
	f.Fuzz(func(t *testing.T, method, path string, body []byte) {
		if len(body) > 1<<16 || len(path) > 512 || len(path) == 0 || path[0] != '/' {
			return
		}
		s, err := bmcsim.New(bmcsim.Config{Tree: tr})
		if err != nil {
			t.Fatal(err)
		}
		req := httptest.NewRequest("GET", "/", bytes.NewReader(body))
		req.Method, req.URL.Path = method, path
		req.SetBasicAuth("admin", "password")
		w := httptest.NewRecorder()
		s.ServeHTTP(w, req)
		if w.Code < 200 || w.Code > 599 {
			t.Fatalf("status %d", w.Code)
		}
	})
}
