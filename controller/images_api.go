package controller

import (
	"net/http"
	"sort"

	"github.com/machina-metal/machina/api"
	v1 "github.com/machina-metal/machina/api/v1"
	"github.com/machina-metal/machina/images"
	"github.com/machina-metal/machina/reconciler"
)

// mountImages adds GET /api/v1/images (admin token): every image the
// acting inventory names or the controller's store holds, with the store's
// record, the running import's progress and the last import failure.
func mountImages(srv *api.Server, ctrl *reconciler.Controller, store *images.Store, live *imageStatus, fails *importFailures) error {
	return srv.HandleAdmin("GET /api/v1/images", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		byName := map[string]*v1.Image{}
		get := func(name string) *v1.Image {
			if im, ok := byName[name]; ok {
				return im
			}
			im := &v1.Image{Name: name}
			byName[name] = im
			return im
		}
		if d := ctrl.Desired(); d != nil {
			for _, im := range d.Images {
				get(im.Name).InInventory = true
			}
		}
		recs, err := store.List()
		if err != nil {
			writeErr(w, http.StatusInternalServerError, "internal", "list the image store: "+err.Error())
			return
		}
		for _, rec := range recs {
			im := get(rec.Name)
			im.State, im.SizeBytes, im.Reason = string(rec.State), rec.SizeBytes, rec.Reason
			if rec.State == images.StateVerified && rec.Raw.Hex != "" {
				im.Digest = string(rec.Raw.Algo) + ":" + rec.Raw.Hex
			}
		}
		live.mu.Lock()
		for name, st := range live.m {
			im := get(name)
			if st.State != images.StateVerified || im.State == "" {
				im.State, im.Percent, im.Reason = string(st.State), st.Percent, st.Reason
			}
		}
		live.mu.Unlock()
		out := v1.ImageList{Items: []v1.Image{}}
		for name, im := range byName {
			if err := fails.reason(name); err != nil {
				im.ImportError = err.Error()
			}
			out.Items = append(out.Items, *im)
		}
		sort.Slice(out.Items, func(i, j int) bool { return out.Items[i].Name < out.Items[j].Name })
		writeJSON(w, http.StatusOK, out)
	}))
}
