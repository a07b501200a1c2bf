"""Generated from protos/ by `harness gen-protos`; do not edit."""
