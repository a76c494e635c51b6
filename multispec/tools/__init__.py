"""The tools built on the library: measuring (`bench`), planning (`tune`), reproducing the papers' claims
(`reproduce`), their theory as calculators (`theory`), training drafts (`distill`) and checking a method's law
(`check`). They import the library core; the core never imports them (`tests/test_imports.py`)."""
