// Package plan decides what must change: [Compute] turns the desired
// inventory and the observed state into steps per server, the steps the
// safety brake holds, and conditions for status (pure: same inputs, same
// plan). Around it: the facts about each action kind as one table
// ([ActionInfo], [Action.Info]), a controller group's [Scope], profile
// selectors ([Select]), the architecture guard ([ServerArch]), the retry
// delay rule ([RetryDelay], [Backoff]) and the plan's renderings
// ([Result.Text], [Result.Markdown], [MarkdownText]).
//
// It imports inventory and state only: no bmc package, no Git package,
// not gitops and not the executor (package reconciler, which carries the
// steps out). So gitops's status writer and machinactl use the plan's
// types without linking a BMC driver; internal/archtest checks it (rule
// plan-pure).
package plan
