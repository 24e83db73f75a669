# Every ```julia block of README.md and docs/**/*.md, run as it is written,
# so the examples cannot rot. A line that ends in `# needs PKG` runs only where
# package PKG is in the environment (and, for a GPU package, `functional()`);
# elsewhere it is left out, so an example can move its arrays to a GPU in one
# line and still run on the CPU.

"Markdown files whose ```julia blocks the suite runs: README.md and docs/**/*.md, found by glob."
function doc_files(root = dirname(@__DIR__))
    files = [joinpath(root, "README.md")]
    docs = joinpath(root, "docs")
    if isdir(docs)
        for (dir, _, names) in walkdir(docs), name in sort(names)
            endswith(name, ".md") && push!(files, joinpath(dir, name))
        end
    end
    return filter(isfile, files)
end

"""
    julia_blocks(text) -> Vector{Tuple{Int, String}}

The fenced ```julia blocks of a Markdown text with the line each starts on
(```julia-repl blocks, doctests of REPL sessions, are not among them).

# Examples
```julia-repl
julia> julia_blocks("a\\n```julia\\nx = 1\\n```\\n")
1-element Vector{Tuple{Int64, String}}:
 (3, "x = 1\\n")
```
"""
function julia_blocks(text::AbstractString)
    blocks = Tuple{Int, String}[]
    lines = split(text, '\n')
    i = 1
    while i <= length(lines)
        if strip(lines[i]) == "```julia"
            start, body = i + 1, IOBuffer()
            i += 1
            while i <= length(lines) && strip(lines[i]) != "```"
                println(body, lines[i])
                i += 1
            end
            push!(blocks, (start, String(take!(body))))
        end
        i += 1
    end
    return blocks
end

"Whether package `name` is in the environment and, for a GPU package, functional here."
function package_usable(name::AbstractString)
    Base.find_package(String(name)) === nothing && return false
    Symbol(name) in keys(GPU_PACKAGES) || return true
    mod = try
        Base.require(Main, Symbol(name))
    catch
        return false
    end
    return Base.invokelatest(mod.functional)
end

"`code` without the lines that end in `# needs PKG` for a package that is not usable here."
function runnable_lines(code::AbstractString)
    kept = String[]
    for line in split(code, '\n')
        m = match(r"#\s*needs\s+([A-Za-z0-9_]+)\s*$", line)
        (m === nothing || package_usable(m.captures[1])) && push!(kept, line)
    end
    return join(kept, '\n')
end

@testset "examples of the docs run: $(basename(file)):$line" for file in doc_files(), (
        line,
        code,
    ) in julia_blocks(read(file, String))
    mod = Module(gensym("doc_example"))
    Core.eval(mod, :(using Test))
    ok = try
        include_string(mod, runnable_lines(code), "$file:$line")
        true
    catch err
        @error "example at $file:$line failed" exception = (err, catch_backtrace())
        false
    end
    @test ok
end

@testset "the docs have Julia examples to run" begin
    @test sum(f -> length(julia_blocks(read(f, String))), doc_files()) >= 1
    @test any(f -> endswith(f, joinpath("docs", "julia.md")), doc_files())
    @test runnable_lines("a = 1\nb = 2  # needs NoSuchPackage\n") == "a = 1\n"
end
