// Builds a TensorRT engine from an ONNX model with trt-otel's progress monitor attached: the
// build's journal, a cancel file and a timeout come from the command line. Works with TensorRT
// and with TensorRT for RTX (the same C++ API); see README.md beside this file.
//
//   build_engine MODEL.onnx [-o ENGINE] [--journal PATH] [--cancel-file PATH]
//                [--timeout DURATION] [--attribute KEY=VALUE]... [--shapes NAME:MIN,OPT,MAX]...
//                [--build-id HEX] [--poll-interval DURATION] [--no-monitor]
//
// Exit codes, as `trt-otel build`'s: 0 built, 2 usage or configuration error (before any build
// starts), 3 cancelled (by the cancel file or the timeout), 4 the build failed.

#include <trt_otel/progress_monitor.h>

#include <NvInfer.h>
#include <NvOnnxParser.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <sys/stat.h>
#include <unistd.h>

namespace
{

constexpr int kBuilt = 0;
constexpr int kUsage = 2;
constexpr int kCancelled = 3;
constexpr int kFailed = 4;

constexpr char const* kUsageText
    = "usage: build_engine MODEL.onnx [-o ENGINE] [--journal PATH] [--cancel-file PATH]\n"
      "                    [--timeout DURATION] [--attribute KEY=VALUE]... [--shapes NAME:MIN,OPT,MAX]...\n"
      "                    [--build-id HEX] [--poll-interval DURATION] [--no-monitor]\n"
      "  DURATION: 90s, 1.5s, 500ms, 15m, 2h (a plain number is seconds)\n"
      "  shapes: NAME:1x8x16x16,2x8x16x16,4x8x16x16 (min, opt, max); a dynamic input without\n"
      "          --shapes is built for 1 in each dynamic dimension\n";

struct UsageError
{
    std::string message;
};

struct ShapeRange
{
    nvinfer1::Dims low, opt, high;
};

struct Arguments
{
    std::string model;
    std::string engine;
    std::string journal;
    std::string cancelFile;
    std::chrono::nanoseconds timeout{0};
    std::chrono::milliseconds pollInterval{100};
    std::map<std::string, std::string> attributes;
    std::map<std::string, ShapeRange> shapes;
    std::string buildId;
    bool monitor{true};
};

//! Seconds in "90s", "1.5s", "500ms", "15m", "2h" or "12" (seconds); nullopt when not one.
std::optional<double> parseDuration(std::string const& text)
{
    std::size_t used = 0;
    double value = 0;
    try
    {
        value = std::stod(text, &used);
    }
    catch (...)
    {
        return std::nullopt;
    }
    std::string const unit = text.substr(used);
    static std::map<std::string, double> const kUnits{{"", 1}, {"ms", 1e-3}, {"s", 1}, {"m", 60}, {"h", 3600}};
    auto const found = kUnits.find(unit);
    if (found == kUnits.end() || !std::isfinite(value) || value < 0 || value * found->second > 366 * 86400.0)
        return std::nullopt;
    return value * found->second;
}

nvinfer1::Dims parseDims(std::string const& text, std::string const& option)
{
    nvinfer1::Dims dims{};
    std::size_t begin = 0;
    while (true)
    {
        std::size_t const end = text.find('x', begin);
        std::string const part = text.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
        if (part.empty() || part.find_first_not_of("0123456789") != std::string::npos || part.size() > 9
            || dims.nbDims == nvinfer1::Dims::MAX_DIMS)
            throw UsageError{option + ": '" + text + "' is not a shape like 1x3x224x224"};
        dims.d[dims.nbDims++] = std::stoll(part);
        if (end == std::string::npos)
            return dims;
        begin = end + 1;
    }
}

//! NAME:MIN,OPT,MAX
std::pair<std::string, ShapeRange> parseShapes(std::string const& text)
{
    std::size_t const colon = text.rfind(':');
    if (colon == std::string::npos || colon == 0)
        throw UsageError{"--shapes: '" + text + "' is not NAME:MIN,OPT,MAX"};
    std::string const name = text.substr(0, colon);
    std::vector<nvinfer1::Dims> dims;
    std::size_t begin = colon + 1;
    while (true)
    {
        std::size_t const end = text.find(',', begin);
        dims.push_back(parseDims(text.substr(begin, end == std::string::npos ? std::string::npos : end - begin), "--shapes"));
        if (end == std::string::npos)
            break;
        begin = end + 1;
    }
    if (dims.size() != 3)
        throw UsageError{"--shapes: '" + text + "' needs three shapes (MIN,OPT,MAX)"};
    for (std::size_t k = 0; k < 3; ++k)
        if (dims[k].nbDims != dims[0].nbDims)
            throw UsageError{"--shapes: the shapes of '" + name + "' have different ranks"};
    for (int32_t i = 0; i < dims[0].nbDims; ++i)
        if (!(dims[0].d[i] <= dims[1].d[i] && dims[1].d[i] <= dims[2].d[i]))
            throw UsageError{"--shapes: '" + name + "' needs MIN <= OPT <= MAX in every dimension"};
    return {name, ShapeRange{dims[0], dims[1], dims[2]}};
}

bool isDirectory(std::string const& path)
{
    struct stat info{};
    return ::stat(path.c_str(), &info) == 0 && S_ISDIR(info.st_mode);
}

std::string folderOf(std::string const& path)
{
    std::size_t const slash = path.rfind('/');
    return slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
}

//! A path the program writes: not empty, not a folder, in a folder that exists.
void checkOutput(std::string const& path, std::string const& option)
{
    if (path.empty())
        throw UsageError{option + " needs a path"};
    if (isDirectory(path))
        throw UsageError{option + " " + path + " is a folder"};
    if (!isDirectory(folderOf(path)))
        throw UsageError{option + " " + path + ": folder " + folderOf(path) + " does not exist"};
}

Arguments parse(int argc, char** argv)
{
    Arguments args;
    std::vector<std::string> positional;
    for (int i = 1; i < argc; ++i)
    {
        std::string const option = argv[i];
        auto value = [&]() -> std::string {
            if (i + 1 >= argc)
                throw UsageError{option + " needs a value"};
            return argv[++i];
        };
        if (option == "-h" || option == "--help")
        {
            std::cout << kUsageText;
            std::exit(kBuilt);
        }
        else if (option == "-o" || option == "--output")
            args.engine = value();
        else if (option == "--journal")
            args.journal = value();
        else if (option == "--cancel-file")
            args.cancelFile = value();
        else if (option == "--timeout" || option == "--poll-interval")
        {
            std::string const text = value();
            std::optional<double> const seconds = parseDuration(text);
            if (!seconds || *seconds <= 0)
                throw UsageError{option + ": '" + text + "' is not a duration longer than 0 (90s, 500ms, 15m, 2h)"};
            auto const ns = std::chrono::nanoseconds(static_cast<long long>(std::llround(*seconds * 1e9)));
            if (option == "--timeout")
                args.timeout = ns;
            else
                args.pollInterval = std::max(std::chrono::milliseconds(1),
                    std::chrono::duration_cast<std::chrono::milliseconds>(ns));
        }
        else if (option == "--attribute")
        {
            std::string const pair = value();
            std::size_t const equals = pair.find('=');
            if (equals == std::string::npos || equals == 0)
                throw UsageError{"--attribute: '" + pair + "' is not KEY=VALUE"};
            std::string const key = pair.substr(0, equals);
            if (key.rfind("trt.", 0) == 0 || key == "model.path")
                throw UsageError{"--attribute: " + key + " is the monitor's own (it records it itself)"};
            args.attributes[key] = pair.substr(equals + 1);
        }
        else if (option == "--shapes")
        {
            auto [name, range] = parseShapes(value());
            if (!args.shapes.emplace(name, range).second)
                throw UsageError{"--shapes: input '" + name + "' is given twice"};
        }
        else if (option == "--build-id")
        {
            args.buildId = value();
            if (args.buildId.size() != 32 || args.buildId.find_first_not_of("0123456789abcdef") != std::string::npos)
                throw UsageError{"--build-id: '" + args.buildId + "' is not 32 lowercase hex digits"};
        }
        else if (option == "--no-monitor")
            args.monitor = false;
        else if (!option.empty() && option[0] == '-')
            throw UsageError{"unknown option " + option};
        else
            positional.push_back(option);
    }
    if (positional.size() != 1)
        throw UsageError{positional.empty() ? "no model given" : "one model only"};
    args.model = positional[0];
    struct stat info{};
    if (::stat(args.model.c_str(), &info) != 0 || !S_ISREG(info.st_mode) || ::access(args.model.c_str(), R_OK) != 0)
        throw UsageError{"model " + args.model + " is not a readable file"};
    if (!args.engine.empty())
        checkOutput(args.engine, "-o");
    if (!args.journal.empty())
        checkOutput(args.journal, "--journal");
    if (!args.cancelFile.empty() && !isDirectory(folderOf(args.cancelFile)))
        throw UsageError{"--cancel-file " + args.cancelFile + ": folder " + folderOf(args.cancelFile) + " does not exist"};
    if (!args.monitor && (!args.journal.empty() || !args.cancelFile.empty() || args.timeout.count() > 0))
        throw UsageError{"--no-monitor builds without the monitor: no --journal, --cancel-file or --timeout"};
    if (!args.engine.empty() && (args.engine == args.model || args.engine == args.journal))
        throw UsageError{"-o " + args.engine + " would overwrite the model or the journal"};
    return args;
}

//! TensorRT's messages on stderr, warnings and worse.
class StderrLogger : public nvinfer1::ILogger
{
public:
    void log(Severity severity, nvinfer1::AsciiChar const* message) noexcept override
    {
        if (severity <= Severity::kWARNING)
            std::fprintf(stderr, "[TensorRT] %s\n", message);
    }
};

template <typename T>
using Owned = std::unique_ptr<T>;

//! Writes the engine next to its final path and renames it there: never a partial engine file.
bool saveEngine(nvinfer1::IHostMemory const& engine, std::string const& path)
{
    std::string const partial = path + ".partial-" + std::to_string(::getpid());
    {
        std::ofstream out(partial, std::ios::binary | std::ios::trunc);
        out.write(static_cast<char const*>(engine.data()), static_cast<std::streamsize>(engine.size()));
        out.flush();
        if (!out)
        {
            std::remove(partial.c_str());
            return false;
        }
    }
    if (std::rename(partial.c_str(), path.c_str()) != 0)
    {
        std::remove(partial.c_str());
        return false;
    }
    return true;
}

int build(Arguments const& args)
{
    StderrLogger console;
    std::unique_ptr<trt_otel::ProgressMonitor> monitor;
    std::unique_ptr<trt_otel::Logger> logger;
    if (args.monitor)
    {
        trt_otel::Options options;
        options.journal = args.journal;
        options.cancel_file = args.cancelFile;
        options.timeout = args.timeout;
        options.poll_interval = args.pollInterval;
        options.model_path = args.model;
        options.attributes = args.attributes;
        options.build_id = args.buildId;
        try
        {
            monitor = std::make_unique<trt_otel::ProgressMonitor>(options);
        }
        catch (std::exception const& error)
        {
            std::fprintf(stderr, "build_engine: %s\n", error.what());
            return kUsage;
        }
        // TensorRT's warnings and errors (BuildCanceled among them) in the journal too.
        logger = std::make_unique<trt_otel::Logger>(*monitor, &console);
        monitor->start(); // the build (and its timeout) begins with the model's parsing
    }
    nvinfer1::ILogger& trtLogger = logger ? static_cast<nvinfer1::ILogger&>(*logger) : console;

    // Ends the journal's build as a failure with the reason; exits 4, or 2 for a bad option.
    auto fail = [&](std::string const& why, int code = kFailed) {
        std::fprintf(stderr, "build_engine: %s\n", why.c_str());
        if (monitor)
            monitor->end(false, why);
        return code;
    };
    Owned<nvinfer1::IBuilder> builder(nvinfer1::createInferBuilder(trtLogger));
    if (!builder)
        return fail("TensorRT could not create a builder");
    Owned<nvinfer1::INetworkDefinition> network(builder->createNetworkV2(0));
    Owned<nvonnxparser::IParser> parser(network ? nvonnxparser::createParser(*network, trtLogger) : nullptr);
    if (!parser)
        return fail("TensorRT could not create a network and its ONNX parser");
    if (!parser->parseFromFile(args.model.c_str(), static_cast<int>(nvinfer1::ILogger::Severity::kWARNING)))
    {
        std::string why = "cannot parse " + args.model;
        for (int32_t i = 0; i < parser->getNbErrors(); ++i)
            why += std::string(i == 0 ? ": " : "; ") + parser->getError(i)->desc();
        return fail(why);
    }
    Owned<nvinfer1::IBuilderConfig> config(builder->createBuilderConfig());
    if (!config)
        return fail("TensorRT could not create a builder config");

    // One optimization profile: the given shapes, else 1 for each dynamic dimension.
    nvinfer1::IOptimizationProfile* profile = builder->createOptimizationProfile();
    bool dynamic = false;
    for (int32_t i = 0; i < network->getNbInputs(); ++i)
    {
        nvinfer1::ITensor const* input = network->getInput(i);
        nvinfer1::Dims dims = input->getDimensions();
        auto const given = args.shapes.find(input->getName());
        bool isDynamic = false;
        for (int32_t k = 0; k < dims.nbDims; ++k)
            isDynamic = isDynamic || dims.d[k] < 0;
        if (given != args.shapes.end())
        {
            if (given->second.low.nbDims != dims.nbDims)
                return fail("--shapes " + given->first + ": the model's input has rank " + std::to_string(dims.nbDims), kUsage);
            using nvinfer1::OptProfileSelector;
            profile->setDimensions(input->getName(), OptProfileSelector::kMIN, given->second.low);
            profile->setDimensions(input->getName(), OptProfileSelector::kOPT, given->second.opt);
            profile->setDimensions(input->getName(), OptProfileSelector::kMAX, given->second.high);
            dynamic = true;
        }
        else if (isDynamic)
        {
            for (int32_t k = 0; k < dims.nbDims; ++k)
                dims.d[k] = dims.d[k] < 0 ? 1 : dims.d[k];
            for (auto selector : {nvinfer1::OptProfileSelector::kMIN, nvinfer1::OptProfileSelector::kOPT,
                     nvinfer1::OptProfileSelector::kMAX})
                profile->setDimensions(input->getName(), selector, dims);
            dynamic = true;
        }
    }
    for (auto const& [name, range] : args.shapes)
    {
        bool found = false;
        for (int32_t i = 0; i < network->getNbInputs(); ++i)
            found = found || name == network->getInput(i)->getName();
        if (!found)
            return fail("--shapes: the model has no input '" + name + "'", kUsage);
    }
    if (dynamic && config->addOptimizationProfile(profile) < 0)
        return fail("TensorRT refused the optimization profile");

    if (monitor)
        config->setProgressMonitor(monitor.get());
    auto const began = std::chrono::steady_clock::now();
    Owned<nvinfer1::IHostMemory> engine(builder->buildSerializedNetwork(*network, *config));
    double const seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();

    bool saved = engine != nullptr;
    if (engine && !args.engine.empty() && !saveEngine(*engine, args.engine))
    {
        std::fprintf(stderr, "build_engine: cannot write %s\n", args.engine.c_str());
        saved = false;
    }
    trt_otel::Outcome const outcome = monitor
        ? monitor->end(saved, engine ? "cannot write the engine to " + args.engine : std::string())
        : (saved ? trt_otel::Outcome::kSUCCESS : trt_otel::Outcome::kFAILURE);
    switch (outcome)
    {
    case trt_otel::Outcome::kSUCCESS:
        std::printf("built %s: %zu bytes in %.2fs\n", args.engine.empty() ? "an engine" : args.engine.c_str(),
            static_cast<std::size_t>(engine->size()), seconds);
        return kBuilt;
    case trt_otel::Outcome::kCANCELLATION:
    case trt_otel::Outcome::kTIMEOUT:
        std::printf("%s after %.2fs\n", trt_otel::toString(outcome), seconds);
        return kCancelled;
    case trt_otel::Outcome::kFAILURE: break;
    }
    std::printf("failure after %.2fs\n", seconds);
    return kFailed;
}

} // namespace

int main(int argc, char** argv)
{
    Arguments args;
    try
    {
        args = parse(argc, argv);
    }
    catch (UsageError const& error)
    {
        std::fprintf(stderr, "build_engine: %s\n%s", error.message.c_str(), kUsageText);
        return kUsage;
    }
    trt_otel::Runtime const runtime = trt_otel::loadedRuntime();
    std::printf("%s %s (%s), headers %s\n", runtime.backend == "tensorrt-rtx" ? "TensorRT-RTX" : "TensorRT",
        runtime.version.c_str(), runtime.library.c_str(), trt_otel::headerVersion().c_str());
    std::fflush(stdout);
    return build(args);
}
