// Test driver for trt_otel::ProgressMonitor: calls the monitor exactly as TensorRT's builder
// calls an IProgressMonitor (through the base class's virtual methods), from one or several
// threads, and unwinds like TensorRT when a step is refused.
//
//   driver trace   trace=FILE journal=PATH [delay_us=N] [monitor options]
//                  (a trace line's own "delay_us" replaces delay_us before its callback)
//   driver threads journal=PATH threads=N steps=N
//   driver steps   journal=PATH [total=N] [delay_us=N] [cancel_after=K] [fsize_limit=BYTES
//                  fsize_restore_after=K] [ready_file=PATH] [no_end=1] [log=TEXT]
//                  [monitor options]
//   monitor options: cancel_file=PATH timeout_ms=N poll_ms=N model=PATH build_id=HEX
//                    max_pending=N touch_ms=N end_timeout_ms=N
//
// The last line on stdout is a JSON summary: {"completed": bool, "refused": [phase, step] or
// null, "events_lost": N, "internal_errors": N}.

#include "trt_otel/progress_monitor.h"

#include <csignal>
#include <fstream>
#include <iostream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <sys/resource.h>

namespace
{

struct Args
{
    std::map<std::string, std::string> values;

    std::string text(std::string const& key, std::string const& otherwise = "") const
    {
        auto const found = values.find(key);
        return found == values.end() ? otherwise : found->second;
    }

    long long number(std::string const& key, long long otherwise) const
    {
        auto const found = values.find(key);
        return found == values.end() ? otherwise : std::stoll(found->second);
    }
};

trt_otel::Options monitorOptions(Args const& args)
{
    trt_otel::Options options;
    options.journal = args.text("journal");
    options.cancel_file = args.text("cancel_file");
    options.timeout = std::chrono::milliseconds(args.number("timeout_ms", 0));
    options.poll_interval = std::chrono::milliseconds(args.number("poll_ms", 100));
    options.model_path = args.text("model");
    options.build_id = args.text("build_id");
    options.max_pending_events = static_cast<std::size_t>(args.number("max_pending", 1 << 20));
    options.touch_interval = std::chrono::milliseconds(args.number("touch_ms", 10000));
    options.end_timeout = std::chrono::milliseconds(args.number("end_timeout_ms", 5000));
    return options;
}

//! The open phases as TensorRT keeps them, to unwind them (innermost first) after a refusal.
struct Builder
{
    explicit Builder(nvinfer1::IProgressMonitor& target)
        : monitor(target)
    {
    }

    nvinfer1::IProgressMonitor& monitor;
    std::vector<std::string> open;
    bool refused = false;
    std::string refusedPhase;
    long long refusedStep = -1;

    void start(std::string const& name, char const* parent, int32_t steps)
    {
        monitor.phaseStart(name.c_str(), parent, steps);
        open.push_back(name);
    }

    bool step(std::string const& name, int32_t step)
    {
        if (monitor.stepComplete(name.c_str(), step))
            return true;
        refused = true;
        refusedPhase = name;
        refusedStep = step;
        while (!open.empty())
        {
            monitor.phaseFinish(open.back().c_str());
            open.pop_back();
        }
        return false;
    }

    void finish(std::string const& name)
    {
        monitor.phaseFinish(name.c_str());
        for (auto it = open.end(); it != open.begin();)
        {
            --it;
            if (*it == name)
            {
                open.erase(it);
                break;
            }
        }
    }
};

void pause(long long delayUs)
{
    if (delayUs > 0)
        std::this_thread::sleep_for(std::chrono::microseconds(delayUs));
}

int summary(trt_otel::ProgressMonitor& monitor, Builder const& builder)
{
    std::cout << "{\"completed\": " << (builder.refused ? "false" : "true") << ", \"refused\": ";
    if (builder.refused)
    {
        std::string phase;
        trt_otel::detail::appendJsonString(phase, builder.refusedPhase);
        std::cout << "[" << phase << ", " << builder.refusedStep << "]";
    }
    else
        std::cout << "null";
    std::cout << ", \"events_lost\": " << monitor.eventsLost() << ", \"internal_errors\": "
              << monitor.internalErrors() << "}" << std::endl;
    return 0;
}

int replayTrace(Args const& args)
{
    std::ifstream trace(args.text("trace"));
    if (!trace)
    {
        std::cerr << "driver: cannot read trace " << args.text("trace") << "\n";
        return 2;
    }
    trt_otel::ProgressMonitor monitor(monitorOptions(args));
    Builder builder(monitor);
    long long const delayUs = args.number("delay_us", 0);
    std::string line;
    while (!builder.refused && std::getline(trace, line))
    {
        if (line.find_first_not_of(" \t\r") == std::string::npos)
            continue;
        auto record = trt_otel::detail::parseFlatJsonObject(line);
        if (!record)
        {
            std::cerr << "driver: not a trace line: " << line << "\n";
            return 2;
        }
        std::string const kind = (*record)["cb"].text;
        std::string const name = (*record)["phase_name"].text;
        auto const own = record->find("delay_us");
        pause(own != record->end() ? static_cast<long long>(own->second.number) : delayUs);
        if (kind == "phase_start")
        {
            auto const& parent = (*record)["parent_phase"];
            builder.start(name,
                parent.kind == trt_otel::detail::JsonValue::Kind::kSTRING ? parent.text.c_str() : nullptr,
                static_cast<int32_t>((*record)["num_steps"].number));
        }
        else if (kind == "step_complete")
            builder.step(name, static_cast<int32_t>((*record)["step"].number));
        else
            builder.finish(name);
    }
    monitor.end(!builder.refused);
    return summary(monitor, builder);
}

int threads(Args const& args)
{
    trt_otel::ProgressMonitor monitor(monitorOptions(args));
    auto const count = static_cast<int>(args.number("threads", 4));
    auto const steps = static_cast<int32_t>(args.number("steps", 1000));
    nvinfer1::IProgressMonitor& base = monitor;
    std::vector<std::thread> workers;
    for (int t = 0; t < count; ++t)
    {
        workers.emplace_back([&base, t, steps] {
            std::string const root = "worker " + std::to_string(t);
            std::string const child = root + " / tactic";
            base.phaseStart(root.c_str(), nullptr, steps);
            for (int32_t s = 0; s < steps; ++s)
            {
                base.phaseStart(child.c_str(), root.c_str(), 2);
                base.stepComplete(child.c_str(), 0);
                base.stepComplete(child.c_str(), 1);
                base.phaseFinish(child.c_str());
                base.stepComplete(root.c_str(), s);
            }
            base.phaseFinish(root.c_str());
        });
    }
    for (auto& worker : workers)
        worker.join();
    monitor.end(true);
    Builder none(monitor);
    return summary(monitor, none);
}

int steps(Args const& args)
{
    trt_otel::ProgressMonitor monitor(monitorOptions(args));
    Builder builder(monitor);
    auto const total = static_cast<int32_t>(args.number("total", 200));
    long long const delayUs = args.number("delay_us", 1000);
    long long const cancelAfter = args.number("cancel_after", -1);
    long long const fsizeLimit = args.number("fsize_limit", -1);
    long long const fsizeRestoreAfter = args.number("fsize_restore_after", -1);
    std::string const readyFile = args.text("ready_file");
    if (fsizeLimit >= 0)
    {
        // A full disk: writes past the limit fail with EFBIG (SIGXFSZ ignored, as a server would).
        std::signal(SIGXFSZ, SIG_IGN);
        rlimit limit{static_cast<rlim_t>(fsizeLimit), RLIM_INFINITY};
        setrlimit(RLIMIT_FSIZE, &limit);
    }
    monitor.start();
    std::string const message = args.text("log");
    if (!message.empty())
    {
        // TensorRT's logger as an application wires it: through trt_otel::Logger.
        trt_otel::Logger logger(monitor);
        nvinfer1::ILogger& tensorrt = logger;
        tensorrt.log(nvinfer1::ILogger::Severity::kWARNING, message.c_str());
        tensorrt.log(nvinfer1::ILogger::Severity::kVERBOSE, "below the least severity kept");
    }
    builder.start("Building engine", nullptr, total);
    for (int32_t s = 0; s < total && !builder.refused; ++s)
    {
        builder.start("Timing tactics", "Building engine", 3);
        for (int32_t k = 0; k < 3 && !builder.refused; ++k)
        {
            pause(delayUs);
            builder.step("Timing tactics", k);
        }
        if (builder.refused)
            break;
        builder.finish("Timing tactics");
        if (s == cancelAfter)
        {
            // From another thread, as an application's watchdog would; the very next step must
            // be refused.
            std::thread([&monitor] { monitor.cancel("stop requested by the test driver"); }).join();
        }
        if (s == fsizeRestoreAfter)
        {
            rlimit limit{RLIM_INFINITY, RLIM_INFINITY};
            setrlimit(RLIMIT_FSIZE, &limit);
        }
        if (s == 2 && !readyFile.empty())
            std::ofstream(readyFile) << "ready\n";
        builder.step("Building engine", s);
    }
    if (!builder.refused)
        builder.finish("Building engine");
    if (args.number("no_end", 0) == 0)
        monitor.end(!builder.refused);
    return summary(monitor, builder);
}

} // namespace

int main(int argc, char** argv)
{
    if (argc < 2)
    {
        std::cerr << "usage: driver (trace|threads|steps) key=value...\n";
        return 2;
    }
    Args args;
    for (int i = 2; i < argc; ++i)
    {
        std::string const item = argv[i];
        auto const equals = item.find('=');
        if (equals == std::string::npos)
        {
            std::cerr << "driver: expected key=value, got " << item << "\n";
            return 2;
        }
        args.values[item.substr(0, equals)] = item.substr(equals + 1);
    }
    std::string const mode = argv[1];
    try
    {
        if (mode == "trace")
            return replayTrace(args);
        if (mode == "threads")
            return threads(args);
        if (mode == "steps")
            return steps(args);
    }
    catch (std::exception const& error)
    {
        std::cerr << "driver: " << error.what() << "\n";
        return 2;
    }
    std::cerr << "driver: unknown mode " << mode << "\n";
    return 2;
}
