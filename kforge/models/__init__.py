"""Whole models: a model file's forward, cut into regions, each region a verified kernel where it
wins, stitched back into one forward that is verified and timed end to end.

    model file (KernelBench format: Model, get_inputs, get_init_inputs; a level-3 net, or a
    decoder built from a transformers config with random weights)
      capture     torch.export of Model(*get_init_inputs()) on get_inputs() (graph.py)
      partition   nodes grouped by the modules they ran in, a module refined into its children
                  while it holds more heavy ops (GEMMs, convolutions, attention) than a region
                  may (partition.py); identical regions (code and shapes) are one cell
      regions     each a KernelBench problem file of its own: its activations as inputs, its
                  parameters and buffers as the Model's (region_problem.py)
      pipeline    the existing pipeline over the regions as a suite: generate, compile, verify,
                  profile, analyze, refine, select, the ship rule (pipeline.py)
      stitch      one ModelNew for the whole file: a shipped region's kernel where one shipped,
                  the region's own PyTorch ops where none did (stitch.py)
      end to end  the stitched forward verified against the reference and timed against eager
                  and torch.compile, each in a process of its own (run.py)

Parameters stay the model's own: a region's kernel reads the real weights every call (the
per-call contract of every suite), so a 32-layer model with one kind of layer is one cell.
"""
