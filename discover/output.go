package discover

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// WriteTable writes rep as an aligned table, one row per address that
// answered: ADDRESS STATUS CREDENTIALS MANUFACTURER MODEL SERIAL MACS NOTE,
// then a summary line.
func WriteTable(w io.Writer, rep *Report) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ADDRESS\tSTATUS\tCREDENTIALS\tMANUFACTURER\tMODEL\tSERIAL\tMACS\tNOTE")
	counts := map[Status]int{}
	for _, r := range rep.Results {
		counts[r.Status]++
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Address, r.Status, dash(r.Credentials), dash(r.Manufacturer), dash(r.Model), dash(r.Serial), dash(strings.Join(r.MACs, ",")), r.Error)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintf(w, "%s: %d probed, %d answered, %d authenticated, %d refused every credential, %d not Redfish, %d errors\n",
		rep.Range, rep.Probed, len(rep.Results), counts[StatusAuthenticated], counts[StatusAuthFailed], counts[StatusNotRedfish], counts[StatusError])
	return err
}

// WriteJSON writes rep as indented JSON (the API's scan response shape).
func WriteJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
