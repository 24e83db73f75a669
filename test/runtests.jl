# One test suite, written once, run on every KernelAbstractions backend this
# machine has: the CPU always, and CUDA, AMDGPU, oneAPI and Metal when their
# package is in the environment and functional. Expected values come from the
# golden files the Python oracle writes (test/golden/*.toml).
#
# `] test ScanWeaver` runs it on the CPU (the GPU packages are weak
# dependencies, not test targets); `test/gpu/Project.toml` is the environment
# that holds them too:
#     julia --project=test/gpu -e 'import Pkg; Pkg.develop(path="."); Pkg.instantiate()'
#     julia --project=test/gpu test/runtests.jl

"Packages the suite loads beyond ScanWeaver and the standard library."
const TEST_PACKAGES = (
    "Adapt",
    "BFloat16s",
    "ChainRulesCore",
    "KernelAbstractions",
    "StaticArrays",
)

let missing = [p for p in TEST_PACKAGES if Base.find_package(p) === nothing]
    if !isempty(missing)
        error(
            "ScanWeaver tests: $(join(missing, ", ")) not in the active environment; run " *
                "`] test ScanWeaver`, or the suite in an environment that holds the test " *
                "dependencies: `julia --project=test/gpu test/runtests.jl` after " *
                "`julia --project=test/gpu -e 'import Pkg; Pkg.develop(path=\".\"); Pkg.instantiate()'`",
        )
    end
end

using ScanWeaver
using Adapt: Adapt
using KernelAbstractions
using StaticArrays
using Random
using TOML
using Test

include("golden.jl")
include("golden_mamba.jl")
include("golden_matrix.jl")
include("reference.jl")
include("testsuite.jl")

"GPU package => its array type, tried when the package is in the environment."
const GPU_PACKAGES = (
    CUDA = :CuArray,
    AMDGPU = :ROCArray,
    oneAPI = :oneArray,
    Metal = :MtlArray,
)

const BACKENDS = Any[("CPU", Array)]
for (pkg, array_type) in pairs(GPU_PACKAGES)
    if Base.find_package(String(pkg)) === nothing
        @info "ScanWeaver tests: skipping $pkg (not in the environment; `import Pkg; Pkg.add(\"$pkg\")`)"
        continue
    end
    loaded = try
        @eval using $pkg
        true
    catch err
        @info "ScanWeaver tests: skipping $pkg (it does not load here: $(sprint(showerror, err)))"
        false
    end
    loaded || continue
    gpu = getfield(@__MODULE__, pkg)
    if Base.invokelatest(gpu.functional)
        push!(BACKENDS, (String(pkg), getfield(gpu, array_type)))
    else
        @info "ScanWeaver tests: skipping $pkg ($pkg.functional() is false: no device or driver)"
    end
end

@testset "ScanWeaver" begin
    include("test_pairs.jl")
    @testset "golden file layout: $(g.name)" for g in golden_cases()
        check_golden_layout(g)
    end
    @testset "Mamba golden file layout: $(g.name)" for g in mamba_golden_cases()
        check_mamba_golden_layout(g)
    end
    @testset "matrix-state golden file layout: $(g.name)" for g in matrix_golden_cases()
        check_matrix_golden_layout(g)
    end
    for (name, array_type) in BACKENDS
        run_testsuite(name, array_type)
    end
    include("test_matrix_chunked.jl")
    include("test_cpu_only.jl")
    include("test_delta_chunked.jl")
    include("test_gradients.jl")
    include("doc_examples.jl")
end
