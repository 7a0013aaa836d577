# Sourced by the GPU checks' prepare scripts: `prepare_gpu_folder [PACKAGE...]` fills .gpu (ignored
# through .git/info/exclude) with what every check on real ALFWorld needs on a GPU machine that has
# Python 3.12, torch and transformers but no network: cp312 wheels of pydantic, ALFWorld's
# dependencies and the PACKAGEs given, jericho and fast_downward from .venv (libs.tar.xz), and the
# ALFWorld games.
prepare_gpu_folder() {
    grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude
    rm -rf .gpu && mkdir -p .gpu/whl
    for p in alfworld==0.4.2 textworld==1.7.0 mementos==1.3.1 tatsu==5.8.3 termcolor prompt_toolkit hashids \
            more_itertools wcwidth pydantic==2.14.4 pydantic-core==2.50.5 annotated-types typing-inspection "$@"; do
        python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
            --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux1_x86_64 \
            -d .gpu/whl "$p"
    done
    tar -C .venv/lib/python3.11/site-packages -cJf .gpu/libs.tar.xz jericho fast_downward
    cp ../shared/data/alfworld/alfworld_json_2.1.1_slim.tar.xz .gpu/
}
