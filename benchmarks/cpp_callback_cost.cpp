// Cost of TensorRT's callbacks into trt_otel::ProgressMonitor, against simpler C++ monitors, in
// one run. benchmarks/cpp_callback_cost.py compiles and runs it; see BENCHMARKS.md.
//
//   cpp_callback_cost PLAN.jsonl JOURNAL_DIR REPEATS THREADS
//
// PLAN holds one callback per line, in the format of the recorded traces. Every monitor gets
// the whole plan from THREADS threads at once (each with its own phase names, so the protocol
// holds), back to back, called through nvinfer1::IProgressMonitor as TensorRT calls it. Prints
// one line per monitor and run: "name ns_per_callback".

#include "trt_otel/progress_monitor.h"

#include <fstream>
#include <iostream>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

namespace
{

struct Callback
{
    char kind; // s(tart), c(omplete), f(inish)
    std::string name;
    std::string parent;
    bool hasParent;
    int32_t number;
};

//! A monitor that watches nothing (the driver's own cost).
class NoOp : public nvinfer1::IProgressMonitor
{
public:
    void phaseStart(char const*, char const*, int32_t) noexcept override {}
    bool stepComplete(char const*, int32_t) noexcept override { return true; }
    void phaseFinish(char const*) noexcept override {}
};

//! The state update of NVIDIA's sample progress monitor: a mutex and a map of active phases.
class MutexAndMap : public nvinfer1::IProgressMonitor
{
public:
    void phaseStart(char const* name, char const* parent, int32_t steps) noexcept override
    {
        std::lock_guard<std::mutex> lock(mMutex);
        int indent = 0;
        if (parent != nullptr)
        {
            auto const found = mActive.find(parent);
            if (found != mActive.end())
                indent = found->second.indent + 1;
        }
        mActive[name] = Phase{0, steps, indent};
    }

    bool stepComplete(char const* name, int32_t step) noexcept override
    {
        std::lock_guard<std::mutex> lock(mMutex);
        auto const found = mActive.find(name);
        if (found != mActive.end())
            found->second.steps = step;
        return true;
    }

    void phaseFinish(char const* name) noexcept override
    {
        std::lock_guard<std::mutex> lock(mMutex);
        mActive.erase(name);
    }

private:
    struct Phase
    {
        int32_t steps;
        int32_t numSteps;
        int indent;
    };

    std::mutex mMutex;
    std::unordered_map<std::string, Phase> mActive;
};

std::vector<Callback> loadPlan(char const* path, std::string const& suffix)
{
    std::vector<Callback> plan;
    std::ifstream in(path);
    std::string line;
    while (std::getline(in, line))
    {
        auto record = trt_otel::detail::parseFlatJsonObject(line);
        if (!record)
            continue;
        std::string const kind = (*record)["cb"].text;
        Callback callback{kind == "phase_start" ? 's' : kind == "step_complete" ? 'c' : 'f',
            (*record)["phase_name"].text + suffix, "", false, 0};
        auto const& parent = (*record)["parent_phase"];
        if (parent.kind == trt_otel::detail::JsonValue::Kind::kSTRING)
        {
            callback.parent = parent.text + suffix;
            callback.hasParent = true;
        }
        callback.number = static_cast<int32_t>(
            callback.kind == 's' ? (*record)["num_steps"].number : (*record)["step"].number);
        plan.push_back(std::move(callback));
    }
    return plan;
}

void play(nvinfer1::IProgressMonitor& monitor, std::vector<Callback> const& plan)
{
    for (Callback const& callback : plan)
    {
        if (callback.kind == 's')
            monitor.phaseStart(callback.name.c_str(), callback.hasParent ? callback.parent.c_str() : nullptr,
                callback.number);
        else if (callback.kind == 'c')
            monitor.stepComplete(callback.name.c_str(), callback.number);
        else
            monitor.phaseFinish(callback.name.c_str());
    }
}

//! Mean wall time per callback, all threads calling at once.
double nsPerCallback(nvinfer1::IProgressMonitor& monitor, std::vector<std::vector<Callback>> const& plans)
{
    std::size_t total = 0;
    for (auto const& plan : plans)
        total += plan.size();
    auto const began = std::chrono::steady_clock::now();
    if (plans.size() == 1)
        play(monitor, plans[0]);
    else
    {
        std::vector<std::thread> threads;
        for (auto const& plan : plans)
            threads.emplace_back([&monitor, &plan] { play(monitor, plan); });
        for (auto& thread : threads)
            thread.join();
    }
    auto const elapsed = std::chrono::steady_clock::now() - began;
    return static_cast<double>(std::chrono::duration_cast<std::chrono::nanoseconds>(elapsed).count())
        / static_cast<double>(total);
}

} // namespace

int main(int argc, char** argv)
{
    if (argc != 5)
    {
        std::cerr << "usage: cpp_callback_cost PLAN.jsonl JOURNAL_DIR REPEATS THREADS\n";
        return 2;
    }
    std::string const directory = argv[2];
    int const repeats = std::stoi(argv[3]);
    int const threads = std::stoi(argv[4]);
    std::vector<std::vector<Callback>> plans;
    for (int t = 0; t < threads; ++t)
        plans.push_back(loadPlan(argv[1], threads == 1 ? "" : " #" + std::to_string(t)));
    if (plans[0].empty())
    {
        std::cerr << "cpp_callback_cost: no callbacks in " << argv[1] << "\n";
        return 2;
    }
    for (int run = 0; run < repeats; ++run)
    {
        {
            NoOp monitor;
            std::cout << "no-op " << nsPerCallback(monitor, plans) << "\n";
        }
        {
            MutexAndMap monitor;
            std::cout << "mutex-and-map " << nsPerCallback(monitor, plans) << "\n";
        }
        {
            trt_otel::Options options;
            options.journal = directory + "/run-" + std::to_string(run) + ".jsonl";
            trt_otel::ProgressMonitor monitor(options);
            monitor.start();
            double const figure = nsPerCallback(monitor, plans);
            monitor.end(true);
            if (monitor.eventsLost() != 0)
            {
                std::cerr << "cpp_callback_cost: the journal lost events\n";
                return 1;
            }
            std::cout << "trt-otel " << figure << "\n";
        }
    }
    return 0;
}
