package discover

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"unicode/utf8"
)

// WriteTable writes rep as an aligned table, one row per address that
// answered: ADDRESS STATUS CREDENTIALS MANUFACTURER MODEL SERIAL MACS NOTE,
// then a summary line. Every cell comes from the network (a BMC, or
// anything else answering in the range), so each is passed through
// [cell]: control characters (ESC, CR, tab...) cannot move the cursor,
// recolour or rewrite the operator's terminal, nor break the columns.
func WriteTable(w io.Writer, rep *Report) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ADDRESS\tSTATUS\tCREDENTIALS\tMANUFACTURER\tMODEL\tSERIAL\tMACS\tNOTE")
	counts := map[Status]int{}
	for _, r := range rep.Results {
		counts[r.Status]++
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", cell(r.Address), cell(string(r.Status)), dash(r.Credentials), dash(r.Manufacturer),
			dash(r.Model), dash(r.Serial), dash(strings.Join(r.MACs, ",")), cell(r.Error))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if rep.Incomplete != "" {
		fmt.Fprintf(w, "INCOMPLETE: %s\n", cell(rep.Incomplete))
	}
	_, err := fmt.Fprintf(w, "%s: %d probed, %d answered, %d authenticated, %d refused every credential, %d not Redfish, %d errors\n",
		cell(rep.Range), rep.Probed, len(rep.Results), counts[StatusAuthenticated], counts[StatusAuthFailed], counts[StatusNotRedfish], counts[StatusError])
	return err
}

// WriteJSON writes rep as indented JSON (the API's scan response shape).
func WriteJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// dash is cell(s), or "-" for an empty cell.
func dash(s string) string {
	if s == "" {
		return "-"
	}
	return cell(s)
}

// cell makes s safe for one table cell on a terminal: control characters
// (C0, DEL, C1) and invalid UTF-8 become '?', so a value a BMC reports
// cannot carry an escape sequence or a line or column break.
func cell(s string) string {
	return strings.Map(func(r rune) rune {
		if r < 0x20 || (r >= 0x7f && r < 0xa0) || r == utf8.RuneError {
			return '?'
		}
		return r
	}, s)
}
