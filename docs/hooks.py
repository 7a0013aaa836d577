"""MkDocs hook: the figures under benchmarks/results/ are published with the pages that show them
(they are written by the benchmarks, so they live beside the result files, not in docs/)."""

from pathlib import Path

from mkdocs.structure.files import File


def on_files(files, config):
    root = Path(config.config_file_path).parent
    for figure in sorted((root / "benchmarks" / "results").glob("*.png")):
        files.append(File(f"benchmarks/results/{figure.name}", str(root), config.site_dir, config.use_directory_urls))
    return files
