package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing/fstest"
	"time"

	"github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/plumbing/object"
	"github.com/spf13/cobra"

	"github.com/machina-metal/machina/gitops"
	"github.com/machina-metal/machina/inventory"
	"github.com/machina-metal/machina/reconciler/plan"
	"github.com/machina-metal/machina/state"
)

// planNow is the clock of `machinactl plan` (deadlines in the plan); tests
// replace it for golden output.
var planNow = time.Now

// MarkdownPartSeparator is the line `machinactl plan --format markdown`
// prints between two pull-request comments when the plan does not fit in
// one: split the output on it and post each part as its own comment.
const MarkdownPartSeparator = "<!-- machina-plan: next comment -->"

// planReport is the JSON form of `machinactl plan --format json`.
type planReport struct {
	// Inventory is the planned revision's digest ("sha256:…").
	Inventory string `json:"inventory"`
	// Base is the base revision's commit with --base, else "".
	Base string `json:"base,omitempty"`
	// Head is the commit planned with --base, else "" (the working tree).
	Head string `json:"head,omitempty"`
	// Observed says where the observed state came from: "api" or "status".
	Observed string `json:"observed"`
	// Servers is the number of observed servers.
	Servers int `json:"servers"`
	// Changes is true when the plan has steps or held steps (exit code 1).
	Changes bool `json:"changes"`
	plan.Result
}

// newPlanCmd is `machinactl plan`: what merging a change would do. Exit 0
// no change, 1 changes (steps or held steps), 2 an error.
func newPlanCmd(e *env) *cobra.Command {
	var repoDir, base, observed, format string
	var maxComment int
	var brakeShare float64
	cmd := &cobra.Command{
		Use:   "plan [--repo DIR] [--base REV] [--observed URL|STATUS_DIR] [--format text|json|markdown]",
		Short: "Print what merging an inventory change would do",
		Long: `Plan the inventory at --repo (default ".") against the fleet's observed state.

Without --base the working tree's servers.yaml, profiles.yaml and images.yaml
are planned. With --base REV (a branch, tag or commit, e.g. origin/main) the
change merged into the base is planned: HEAD of --repo must contain REV
(check out the pull request's merge commit, or rebase), and the inventory
files are read from HEAD's commit (at --repo's folder when --repo is a
folder inside the repository); uncommitted edits are ignored.

The observed state comes from --observed: an http(s):// URL is the
controller's admin API (token from MACHINA_TOKEN); anything else is a
status tree, the status/ folder the controller commits (a folder holding
servers/, or a repository holding status/servers/). Without --observed:
MACHINA_API when set, else the repository's status/ (read from REV's commit
with --base, from the working tree without).

Steps the safety brake would hold (a revision releasing or retiring more
than --brake-share of the fleet, or bringing a profile to zero deployed
servers) are listed under HELD, with the "machinactl approve REV" that
lets the controller run them; lines starting with "!" are conditions,
e.g. a profile that too few ready servers fit. Approvals are recorded in
the controller: with the admin API as observed state they count (an
approved revision is planned, not held); a status tree does not carry
them, so a plan from one still shows an approved revision as HELD.

Exit code: 0 no change, 1 changes (held ones included), 2 an error.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if brakeShare < 0 || brakeShare > 1 {
				return &exitError{code: 2, err: fmt.Errorf("plan: --brake-share %v: want 0 to 1", brakeShare)}
			}
			switch format {
			case "text", "json", "markdown":
			default:
				return &exitError{code: 2, err: fmt.Errorf("plan: --format %q: want text, json or markdown", format)}
			}
			now := planNow()
			src, err := loadPlanSource(repoDir, base)
			if err != nil {
				return &exitError{code: 2, err: fmt.Errorf("plan: %w", err)}
			}
			if observed == "" {
				observed = os.Getenv(envAPI)
			}
			have, from, approved, err := observedState(cmd.Context(), e, observed, src, now)
			if err != nil {
				return err
			}
			res := plan.Compute(src.want, have, plan.Options{Now: now, BrakeShare: brakeShare, Approved: approved})
			changes := len(res.Steps) > 0 || len(res.Held) > 0
			rep := planReport{Inventory: src.want.Digest, Base: src.baseCommit, Head: src.headCommit, Observed: from, Servers: len(have.Servers), Changes: changes, Result: res}
			if err := printPlan(e, format, rep, maxComment); err != nil {
				return err
			}
			if changes {
				return &exitError{code: 1}
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&repoDir, "repo", ".", "inventory repository (working tree) to plan")
	cmd.Flags().StringVar(&base, "base", "", "plan the change merged into this revision (HEAD must contain it)")
	cmd.Flags().StringVar(&observed, "observed", "", "observed state: admin API URL or status tree folder (default $"+envAPI+", else the repository's status/)")
	cmd.Flags().StringVar(&format, "format", "text", "output: text, json or markdown (a pull-request comment)")
	cmd.Flags().Float64Var(&brakeShare, "brake-share", 0, "safety brake: share of the fleet a revision may release or retire before it is held, as the controller is configured (machina serve --brake-share); 0 means 0.2")
	cmd.Flags().IntVar(&maxComment, "max-comment-bytes", 60000, "markdown: split into comments of at most this many bytes (GitHub allows 65,536 characters)")
	return cmd
}

// observedState reads the fleet's observed state from --observed (the
// admin API, with its approvals, or a status tree), $MACHINA_API, or the
// repository's status/; from says which ("api" or "status").
func observedState(ctx context.Context, e *env, observed string, src *planSource, now time.Time) (have state.Snapshot, from string, approved bool, err error) {
	// Approvals live in the controller's store: known only when
	// the observed state comes from the API.
	identity := src.base
	if identity == nil {
		identity = src.want
	}
	switch {
	case strings.HasPrefix(observed, "http://") || strings.HasPrefix(observed, "https://"):
		c, err := e.apiClient(observed)
		if err != nil {
			return have, from, approved, &exitError{code: 2, err: fmt.Errorf("plan: %w", err)}
		}
		if have, err = snapshotFromAPI(ctx, c); err != nil {
			return have, from, approved, &exitError{code: 2, err: fmt.Errorf("plan: observed state from the API: %w", err)}
		}
		if err := firmwareFromAPI(ctx, c, src.want, have); err != nil {
			return have, from, approved, &exitError{code: 2, err: fmt.Errorf("plan: firmware reads from the API: %w", err)}
		}
		aps, err := c.Approvals(ctx)
		if err != nil {
			return have, from, approved, &exitError{code: 2, err: fmt.Errorf("plan: approvals from the API: %w", err)}
		}
		approved = aps.Approves(src.want.Digest)
		from = "api"
	case observed != "":
		fsys, dir := os.DirFS(observed), "."
		if _, err := fs.Stat(fsys, "servers"); err != nil {
			dir = "status"
		}
		if have, err = snapshotFromStatus(fsys, dir, identity, now); err != nil {
			return have, from, approved, &exitError{code: 2, err: fmt.Errorf("plan: observed state: %w", err)}
		}
		from = "status"
	default:
		if src.status == nil {
			return have, from, approved, &exitError{code: 2, err: errors.New("plan: no observed state: pass --observed URL|STATUS_DIR or set " + envAPI + " (the repository has no status/servers)")}
		}
		if have, err = snapshotFromStatus(src.status, "status", identity, now); err != nil {
			return have, from, approved, &exitError{code: 2, err: fmt.Errorf("plan: observed state: %w", err)}
		}
		from = "status"
	}

	return have, from, approved, nil
}

// printPlan writes rep in format: text, json, or markdown split into
// pull-request comments of at most maxComment bytes.
func printPlan(e *env, format string, rep planReport, maxComment int) error {
	switch format {
	case "text":
		// Conditions quote machine text (a wipe's failure reason).
		fmt.Fprint(e.stdout, planHeader(rep, "")+"\n"+termSafeLines(rep.Result.Text()))
	case "json":
		enc := json.NewEncoder(e.stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			return &exitError{code: 2, err: fmt.Errorf("plan: %w", err)}
		}
	case "markdown":
		head := planHeader(rep, "`") + "\n\n"
		parts := rep.Result.Markdown(maxComment - len(head))
		for i, p := range parts {
			if i > 0 {
				fmt.Fprintln(e.stdout, MarkdownPartSeparator)
			} else {
				p = strings.Replace(p, "### Machina plan\n\n", "### Machina plan\n\n"+head, 1)
			}
			fmt.Fprint(e.stdout, p)
		}
	}
	return nil
}

// planHeader is the one-line summary above a text or markdown plan; q
// quotes identifiers (markdown code spans).
func planHeader(r planReport, q string) string {
	what := "inventory " + q + shortDigest(r.Inventory) + q
	if r.Head != "" {
		what += " at " + q + r.Head[:12] + q + " merged into " + q + r.Base[:12] + q
	} else {
		what += " (working tree)"
	}
	from := "the controller's API"
	if r.Observed == "status" {
		from = "the status tree"
	}
	n := len(r.Steps)
	s := fmt.Sprintf("Plan for %s against %s observed from %s: %s", what, plural(r.Servers, "server"), from, plural(n, "step"))
	if len(r.Held) > 0 {
		s += fmt.Sprintf(", %d held", len(r.Held))
	}
	return s + "."
}

func shortDigest(d string) string {
	d = strings.TrimPrefix(d, "sha256:")
	if len(d) > 12 {
		d = d[:12]
	}
	return d
}

// planSource is the planned inventory and what comes with it.
type planSource struct {
	want *inventory.Inventory
	// base is the base revision's inventory with --base (nil without, or
	// when the base has no valid inventory).
	base                   *inventory.Inventory
	baseCommit, headCommit string
	// status is a filesystem holding status/servers/ (the base commit's
	// tree with --base, the working tree without), nil when absent.
	status fs.FS
}

// inventoryFiles are the files inventory.Load reads at the repository root.
var inventoryFiles = inventory.Files

// loadPlanSource loads the inventory to plan from dir's working tree, or,
// with base, from HEAD's commit after checking that it contains base.
func loadPlanSource(dir, base string) (*planSource, error) {
	if base == "" {
		fsys := os.DirFS(dir)
		inv, err := loadInventory(fsys, dir)
		if err != nil {
			return nil, err
		}
		src := &planSource{want: inv}
		if _, err := fs.Stat(fsys, "status/servers"); err == nil {
			src.status = fsys
		}
		return src, nil
	}
	repo, err := git.PlainOpenWithOptions(dir, &git.PlainOpenOptions{DetectDotGit: true, EnableDotGitCommonDir: true})
	if err != nil {
		return nil, fmt.Errorf("open repository %s: %w", dir, err)
	}
	// --repo may be a folder inside the repository (DetectDotGit): the
	// inventory files are read at that folder of each commit.
	sub, err := repoSubdir(repo, dir)
	if err != nil {
		return nil, err
	}
	baseHash, err := gitops.ResolveRevision(repo, base)
	if err != nil {
		return nil, fmt.Errorf("resolve --base %s: %w", base, err)
	}
	headRef, err := repo.Head()
	if err != nil {
		return nil, fmt.Errorf("resolve HEAD: %w", err)
	}
	baseC, err := repo.CommitObject(*baseHash)
	if err != nil {
		return nil, fmt.Errorf("read base commit %s: %w", base, err)
	}
	headC, err := repo.CommitObject(headRef.Hash())
	if err != nil {
		return nil, fmt.Errorf("read HEAD commit: %w", err)
	}
	ok, err := baseC.IsAncestor(headC)
	if err != nil {
		return nil, fmt.Errorf("check that HEAD contains %s: %w", base, err)
	}
	if !ok {
		return nil, fmt.Errorf("HEAD (%s) does not contain --base %s (%s): rebase the change or check out its merge commit", headC.Hash.String()[:12], base, baseC.Hash.String()[:12])
	}
	headFS, err := commitFS(headC, sub, inventoryFiles, "")
	if err != nil {
		return nil, err
	}
	want, err := loadInventory(headFS, "HEAD")
	if err != nil {
		return nil, err
	}
	src := &planSource{want: want, baseCommit: baseC.Hash.String(), headCommit: headC.Hash.String()}
	baseFS, err := commitFS(baseC, sub, inventoryFiles, "status/servers/")
	if err != nil {
		return nil, err
	}
	if res, err := inventory.Load(baseFS, inventory.Limits{}); err == nil {
		src.base = res.Inventory
	}
	if _, err := fs.Stat(baseFS, "status/servers"); err == nil {
		src.status = baseFS
	}
	return src, nil
}

// loadInventory loads and validates; an invalid inventory is an error
// listing every problem (file:line).
func loadInventory(fsys fs.FS, where string) (*inventory.Inventory, error) {
	res, err := inventory.Load(fsys, inventory.Limits{})
	var ve *inventory.ValidationError
	if errors.As(err, &ve) {
		lines := make([]string, 0, len(ve.Errors))
		for _, fe := range ve.Errors {
			lines = append(lines, "  "+fe.Error())
		}
		return nil, fmt.Errorf("inventory at %s is invalid:\n%s", filepath.ToSlash(where), strings.Join(lines, "\n"))
	}
	if err != nil {
		return nil, fmt.Errorf("load inventory at %s: %w", where, err)
	}
	return res.Inventory, nil
}

// repoSubdir returns dir's path inside repo's worktree in slash form, ""
// for the root.
func repoSubdir(repo *git.Repository, dir string) (string, error) {
	wt, err := repo.Worktree()
	if err != nil {
		return "", fmt.Errorf("open worktree: %w", err)
	}
	root, err := filepath.EvalSymlinks(wt.Filesystem.Root())
	if err != nil {
		return "", fmt.Errorf("resolve worktree root: %w", err)
	}
	abs, err := filepath.Abs(dir)
	if err == nil {
		abs, err = filepath.EvalSymlinks(abs)
	}
	if err != nil {
		return "", fmt.Errorf("resolve --repo %s: %w", dir, err)
	}
	rel, err := filepath.Rel(root, abs)
	if err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
		return "", fmt.Errorf("--repo %s is outside its repository %s", dir, root)
	}
	if rel == "." {
		return "", nil
	}
	return filepath.ToSlash(rel), nil
}

// commitFS copies the named files of the folder sub ("" for the root) of
// c's tree, and every file under prefix of that folder (when not ""), into
// memory, each capped at 16 MiB; names in the result are relative to sub.
func commitFS(c *object.Commit, sub string, files []string, prefix string) (fs.FS, error) {
	tree, err := c.Tree()
	if err != nil {
		return nil, fmt.Errorf("read tree of %s: %w", c.Hash.String()[:12], err)
	}
	if sub != "" {
		if tree, err = tree.Tree(sub); err != nil {
			return nil, fmt.Errorf("read folder %s at %s: %w", sub, c.Hash.String()[:12], err)
		}
	}
	const limit = 16 << 20
	out := fstest.MapFS{}
	add := func(f *object.File) error {
		if f.Size > limit {
			return fmt.Errorf("%s at %s is larger than %d bytes", f.Name, c.Hash.String()[:12], limit)
		}
		s, err := f.Contents()
		if err != nil {
			return fmt.Errorf("read %s at %s: %w", f.Name, c.Hash.String()[:12], err)
		}
		out[f.Name] = &fstest.MapFile{Data: []byte(s), Mode: 0o644}
		return nil
	}
	for _, name := range files {
		f, err := tree.File(name)
		if errors.Is(err, object.ErrFileNotFound) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("read %s at %s: %w", name, c.Hash.String()[:12], err)
		}
		if err := add(f); err != nil {
			return nil, err
		}
	}
	if prefix != "" {
		sub, err := tree.Tree(strings.TrimSuffix(prefix, "/"))
		if err == nil {
			err = sub.Files().ForEach(func(f *object.File) error {
				if !f.Mode.IsFile() {
					return nil
				}
				f.Name = prefix + f.Name
				return add(f)
			})
			if err != nil {
				return nil, err
			}
		} else if !errors.Is(err, object.ErrDirectoryNotFound) {
			return nil, fmt.Errorf("read %s at %s: %w", prefix, c.Hash.String()[:12], err)
		}
	}
	return out, nil
}
