"""How people reach multispec: the command line (`cli`, with `distill_args` for `multispec distill`) and the
OpenAI-compatible server (`serve`). Thin over the library and the tools, which never import them."""
