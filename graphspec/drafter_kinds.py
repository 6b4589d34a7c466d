"""The drafter kinds by name, and the n-gram drafter's defaults: what `graphspec compile` offers and shows in
--help, without importing the drafters themselves (graphspec/drafters/ imports torch and transformers)."""

# Each drafter class's `kind`, in the order graphspec.drafters.KINDS maps them to the classes (it checks).
KINDS = ("draft_model", "ngram", "mtp", "eagle3", "dflash")
# `draft` strings that name a kind with no checkpoint of its own (n-gram has no model; draft="mtp" reads the
# target checkpoint's head).
NAMED_KINDS = ("ngram", "mtp")
DEFAULT_NGRAM = (1, 3)  # the n-gram drafter's (ngram_min, ngram_max)
