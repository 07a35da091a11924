"""The stop rule's words, spelled once: what a sweep file's seeds policy may say under `until:`
(`seeds: {start: 4, max: 16, until: decided}`), the rule of a fixed list of seeds, and why a
comparison stopped taking seeds. The sweep file's parser and printed plan (`k3lab.registry`), the
seeds policy (`k3lab.runner.tune`) and the statistics and tables (`k3lab.report`) read them here;
it sits with the statistics, the lowest of those layers, so that all of them can.
"""

# -- the rules: when a comparison has seeds enough --------------------------------------------------

DECIDED = "decided"  # better, worse, or equivalent within metric.margin (the default)
HALFWIDTH = "halfwidth"  # until: {halfwidth: H}: its interval's half-width is at most H x |the baseline's metric|
MAX = "max"  # never before max seeds
FIXED = "fixed"  # a list of seeds: one look at them all, no rule
RULES = (DECIDED, HALFWIDTH, MAX)  # what `until:` may say

# -- why a comparison stopped taking seeds -------------------------------------------------------

PRECISE = "precise"  # its interval is as narrow as `until: {halfwidth: H}` asks
MAX_SEEDS = "max seeds"  # it reached the policy's max
BUDGET = "budget"  # the sweep's budget ran out first
RUNNING = "running"  # the sweep is still adding seeds
STOPPED = "stopped"  # the sweep was stopped before its budget ended (`--resume` adds seeds)
