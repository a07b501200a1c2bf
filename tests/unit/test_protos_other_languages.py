"""The wire API compiles for other languages: every proto file names its Go package (protoc-gen-go refuses a file
without `go_package`; C++, Java, C#, Ruby and PHP need nothing), and the generated Python carries it too."""

import re
from pathlib import Path

from harness.v1 import common_pb2

PROTOS = sorted((Path(__file__).resolve().parents[2] / "protos" / "harness" / "v1").glob("*.proto"))


def test_every_proto_file_names_its_go_package():
    assert len(PROTOS) >= 9
    missing = [p.name for p in PROTOS
               if not re.search(r'^option go_package = "harness/v1;harnessv1";$', p.read_text(), re.M)]
    assert missing == []


def test_the_generated_descriptors_carry_the_go_package():
    # The Python stubs are generated from these files (harness gen-protos --check in CI): the option reached them.
    assert common_pb2.DESCRIPTOR.GetOptions().go_package == "harness/v1;harnessv1"
