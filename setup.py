# Build step: generate the Liftbridge protobuf and gRPC modules (api_pb2.py, api_pb2.pyi,
# api_pb2_grpc.py) from riverlog/protocol/liftbridge/api.proto with grpcio-tools, at build and
# install time; they are not committed (.gitignore). Everything else about the package is in
# pyproject.toml.
#   pip install .        generated into the wheel's build directory (the source tree is untouched)
#   pip install -e .     generated next to api.proto in the source tree; every run regenerates,
#                        so `make install` / `make test` (which rerun it) pick up proto edits
# grpcio-tools comes from [build-system] requires; the protobuf/grpcio runtime floors in
# pyproject.toml must stay at or above the versions its generated code checks for.
# Compiled twins (Cython, riverlog/_compiled.py): every `_*_c.pyx` listed in TWINS is
# cythonized (Cython from [build-system] requires) and compiled beside its Python module;
# `pip install -e .` puts the .so files in the source tree (.gitignore'd with the .c files).
# The build is optional: without Cython or a working C compiler it warns and the package
# installs with the pure-Python codecs (the reference, which runs whenever a twin is missing).
# The generated api_pb2 registers api.proto in a private descriptor pool instead of protobuf's
# default one, so riverlog and another copy of Liftbridge's schema (gufo-liftbridge's api_pb2,
# package `proto` too) can be imported in one process without "duplicate symbol" errors.
from __future__ import annotations

from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
PROTOS = ("riverlog/protocol/liftbridge/api.proto",)

_DEFAULT_POOL = "_descriptor_pool.Default().AddSerializedFile("
_PRIVATE_POOL = "_descriptor_pool.DescriptorPool().AddSerializedFile("


def generate_protos(out_dir: Path) -> list[Path]:
    """Run protoc (from grpcio-tools) on PROTOS, writing package-relative modules under out_dir."""
    try:
        import grpc_tools
        from grpc_tools import protoc
    except ImportError as exc:  # only without build isolation
        raise SystemExit(
            "riverlog's build needs grpcio-tools to generate the Liftbridge protobuf code: "
            "pip install grpcio-tools (or build with isolation, the default)"
        ) from exc
    well_known = Path(grpc_tools.__file__).resolve().parent / "_proto"
    written = []
    for proto in PROTOS:
        out_dir.mkdir(parents=True, exist_ok=True)
        args = [
            "grpc_tools.protoc",
            f"--proto_path={ROOT}",
            f"--proto_path={well_known}",
            f"--python_out={out_dir}",
            f"--pyi_out={out_dir}",
            f"--grpc_python_out={out_dir}",
            str(ROOT / proto),
        ]
        if protoc.main(args) != 0:
            raise SystemExit(f"protoc failed on {proto}")
        stem = proto[: -len(".proto")]
        pb2 = out_dir / f"{stem}_pb2.py"
        _use_private_pool(pb2)
        written += [pb2, out_dir / f"{stem}_pb2.pyi", out_dir / f"{stem}_pb2_grpc.py"]
    return written


def _use_private_pool(path: Path) -> None:
    text = path.read_text()
    if text.count(_DEFAULT_POOL) != 1:
        raise SystemExit(f"{path}: unexpected protoc output (no single {_DEFAULT_POOL!r}); update setup.py")
    text = text.replace(_DEFAULT_POOL, _PRIVATE_POOL)
    head, _, rest = text.partition("\n")
    note = "# riverlog: setup.py rewrote this to register api.proto in a private descriptor pool."
    path.write_text(f"{head}\n{note}\n{rest}")


class BuildPyWithProtos(build_py):
    def run(self) -> None:
        super().run()
        editable = getattr(self, "editable_mode", False)
        generate_protos(ROOT if editable else Path(self.build_lib))


TWINS = (
    "riverlog/protocol/liftbridge/_envelope_c.pyx",
    "riverlog/_record_c.pyx",
    "riverlog/protocol/liftbridge/_messages_c.pyx",
    "riverlog/protocol/_nats_wire_c.pyx",
    "riverlog/log/_chunk_c.pyx",
)


def twin_extensions() -> list[Extension]:
    """The compiled twins as cythonized Extensions, or [] (with a warning) without Cython."""
    try:
        from Cython.Build import cythonize
    except ImportError:
        print("warning: Cython is not installed: riverlog installs with pure-Python codecs")
        return []
    extensions = [Extension(path[: -len(".pyx")].replace("/", "."), [path],
                            extra_compile_args=["-O2"]) for path in TWINS]
    return cythonize(extensions, language_level=3, quiet=True,
                     compiler_directives={"boundscheck": False, "wraparound": False})


class OptionalBuildExt(build_ext):
    """build_ext that warns instead of failing: a twin that does not compile is left out."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # no compiler at all (DistutilsPlatformError and the like)
            self._skipped(exc)

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:  # CompileError, LinkError, a compiler that is not there
            self._failed = getattr(self, "_failed", set()) | {ext.name}
            self._skipped(exc, ext.name)

    def copy_extensions_to_source(self) -> None:  # pip install -e: only the ones built
        every = self.extensions
        self.extensions = [e for e in every if e.name not in getattr(self, "_failed", ())]
        try:
            super().copy_extensions_to_source()
        finally:
            self.extensions = every

    @staticmethod
    def _skipped(exc: Exception, name: str = "compiled twins") -> None:
        print(f"warning: {name} not built ({type(exc).__name__}: {exc}); "
              "riverlog runs the pure-Python code instead")


setup(cmdclass={"build_py": BuildPyWithProtos, "build_ext": OptionalBuildExt},
      ext_modules=twin_extensions())
