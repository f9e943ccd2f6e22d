//! GPIO: inputs (sensors) and outputs (digital and PWM actuators) behind one
//! backend trait. `rppal` drives a Raspberry Pi's GPIO character device;
//! `sim` is a scriptable chip for machines without GPIO (and for tests).

use parking_lot::Mutex;
use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::config::{GpioBackendChoice, Level, Pull};
use super::{ActuatorDriver, DriverFuture, Health, HwError, Readings};

/// An input pin. `changes` yields the electrical level (true = high) on
/// every edge where the backend supports edges; `None` means poll `read`.
pub trait GpioInput: Send + Sync {
    fn read(&self) -> bool;
    fn changes(&mut self) -> Option<watch::Receiver<bool>>;
}

pub trait GpioOutput: Send {
    fn set(&mut self, high: bool) -> Result<(), HwError>;
    /// Duty cycle in [0, 1] at `frequency_hz`.
    fn pwm(&mut self, frequency_hz: f64, duty: f64) -> Result<(), HwError>;
}

pub trait GpioBackend: Send + Sync + fmt::Debug {
    fn name(&self) -> &'static str;
    fn input(&self, pin: u8, pull: Pull) -> Result<Box<dyn GpioInput>, HwError>;
    fn output(&self, pin: u8) -> Result<Box<dyn GpioOutput>, HwError>;
}

/// The backend `[gpio] backend` chose, opened. `sim` is the same chip by its
/// own type when it is the simulated one, whose inputs the REST API sets to
/// rehearse (`POST /v1/gpio/{pin}`); real pins are set by the hardware.
#[derive(Debug, Clone)]
pub struct OpenedGpio {
    pub backend: Arc<dyn GpioBackend>,
    pub sim: Option<Arc<SimGpio>>,
}

impl OpenedGpio {
    fn sim() -> OpenedGpio {
        let chip = Arc::new(SimGpio::default());
        OpenedGpio {
            backend: chip.clone(),
            sim: Some(chip),
        }
    }

    fn real(backend: Arc<dyn GpioBackend>) -> OpenedGpio {
        OpenedGpio { backend, sim: None }
    }
}

/// Whether this machine is a Raspberry Pi (per its device tree).
pub fn is_raspberry_pi() -> bool {
    std::fs::read_to_string("/proc/device-tree/model").is_ok_and(|m| m.contains("Raspberry Pi"))
}

/// The backend `[gpio] backend` asks for: `auto` is rppal on a Pi, sim elsewhere.
pub fn open_backend(choice: GpioBackendChoice) -> Result<OpenedGpio, HwError> {
    match choice {
        GpioBackendChoice::Sim => Ok(OpenedGpio::sim()),
        GpioBackendChoice::Rppal => Ok(OpenedGpio::real(Arc::new(RppalGpio::open()?))),
        GpioBackendChoice::Auto if is_raspberry_pi() => {
            Ok(OpenedGpio::real(Arc::new(RppalGpio::open()?)))
        }
        GpioBackendChoice::Auto => Ok(OpenedGpio::sim()),
    }
}

// ------------------------------------------------------------------ sim

#[derive(Debug)]
struct SimPin {
    level: watch::Sender<bool>,
    output: bool,
    pwm: Option<(f64, f64)>,
}

impl SimPin {
    fn new(level: bool, output: bool) -> Self {
        SimPin {
            level: watch::Sender::new(level),
            output,
            pwm: None,
        }
    }
}

type SimPins = Arc<Mutex<HashMap<u8, SimPin>>>;

/// A simulated GPIO chip. Tests and demos drive inputs with
/// [`SimGpio::set_level`] and read outputs with [`SimGpio::level`].
#[derive(Debug, Default)]
pub struct SimGpio {
    pins: SimPins,
}

impl SimGpio {
    /// Drives an input pin's electrical level (as the outside world would).
    pub fn set_level(&self, pin: u8, high: bool) {
        let mut pins = self.pins.lock();
        let p = pins.entry(pin).or_insert_with(|| SimPin::new(false, false));
        p.level
            .send_if_modified(|l| std::mem::replace(l, high) != high);
    }

    /// A pin's current level.
    pub fn level(&self, pin: u8) -> Option<bool> {
        self.pins.lock().get(&pin).map(|p| *p.level.borrow())
    }

    /// Drives input `pin` from outside (an operator rehearsing a stop
    /// button, `POST /v1/gpio/{pin}`): refused for a pin an actuator drives.
    pub fn set_input(&self, pin: u8, high: bool) -> Result<(), HwError> {
        if self.pins.lock().get(&pin).is_some_and(|p| p.output) {
            return Err(HwError::Unsupported(format!(
                "GPIO {pin} is an output: an actuator drives it"
            )));
        }
        self.set_level(pin, high);
        Ok(())
    }

    /// Every pin in use: (pin, level, whether an actuator drives it), by pin.
    pub fn pins(&self) -> Vec<(u8, bool, bool)> {
        let mut pins: Vec<(u8, bool, bool)> = self
            .pins
            .lock()
            .iter()
            .map(|(pin, p)| (*pin, *p.level.borrow(), p.output))
            .collect();
        pins.sort_unstable();
        pins
    }

    /// A PWM output's (frequency, duty), if PWM was set.
    pub fn pwm(&self, pin: u8) -> Option<(f64, f64)> {
        self.pins.lock().get(&pin).and_then(|p| p.pwm)
    }
}

struct SimInput {
    rx: watch::Receiver<bool>,
}

impl GpioInput for SimInput {
    fn read(&self) -> bool {
        *self.rx.borrow()
    }
    fn changes(&mut self) -> Option<watch::Receiver<bool>> {
        Some(self.rx.clone())
    }
}

struct SimOutput {
    pins: SimPins,
    pin: u8,
}

impl GpioOutput for SimOutput {
    fn set(&mut self, high: bool) -> Result<(), HwError> {
        let mut pins = self.pins.lock();
        let p = pins
            .entry(self.pin)
            .or_insert_with(|| SimPin::new(false, true));
        p.pwm = None;
        p.level.send_replace(high);
        Ok(())
    }
    fn pwm(&mut self, frequency_hz: f64, duty: f64) -> Result<(), HwError> {
        let mut pins = self.pins.lock();
        let p = pins
            .entry(self.pin)
            .or_insert_with(|| SimPin::new(false, true));
        p.pwm = Some((frequency_hz, duty));
        p.level.send_replace(duty > 0.0);
        Ok(())
    }
}

impl GpioBackend for SimGpio {
    fn name(&self) -> &'static str {
        "sim"
    }
    fn input(&self, pin: u8, pull: Pull) -> Result<Box<dyn GpioInput>, HwError> {
        let mut pins = self.pins.lock();
        let p = pins
            .entry(pin)
            .or_insert_with(|| SimPin::new(pull == Pull::Up, false));
        if p.output {
            return Err(HwError::Unsupported(format!("GPIO {pin} is an output")));
        }
        Ok(Box::new(SimInput {
            rx: p.level.subscribe(),
        }))
    }
    fn output(&self, pin: u8) -> Result<Box<dyn GpioOutput>, HwError> {
        self.pins
            .lock()
            .entry(pin)
            .or_insert_with(|| SimPin::new(false, true))
            .output = true;
        Ok(Box::new(SimOutput {
            pins: self.pins.clone(),
            pin,
        }))
    }
}

// ------------------------------------------------------------------ rppal (Raspberry Pi)

/// A Raspberry Pi's GPIO through rppal (the GPIO character device).
pub struct RppalGpio {
    gpio: rppal::gpio::Gpio,
}

impl fmt::Debug for RppalGpio {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("RppalGpio")
    }
}

impl RppalGpio {
    pub fn open() -> Result<Self, HwError> {
        rppal::gpio::Gpio::new()
            .map(|gpio| RppalGpio { gpio })
            .map_err(|e| HwError::Unsupported(format!("cannot open the Raspberry Pi GPIO: {e}")))
    }
}

fn rppal_err(pin: u8) -> impl Fn(rppal::gpio::Error) -> HwError {
    move |e| HwError::io(format!("GPIO {pin}"), e)
}

struct RppalInput {
    pin: rppal::gpio::InputPin,
    rx: watch::Receiver<bool>,
}

impl GpioInput for RppalInput {
    fn read(&self) -> bool {
        self.pin.is_high()
    }
    fn changes(&mut self) -> Option<watch::Receiver<bool>> {
        Some(self.rx.clone())
    }
}

struct RppalOutput {
    pin: rppal::gpio::OutputPin,
    number: u8,
}

impl GpioOutput for RppalOutput {
    fn set(&mut self, high: bool) -> Result<(), HwError> {
        self.pin.clear_pwm().map_err(rppal_err(self.number))?;
        if high {
            self.pin.set_high();
        } else {
            self.pin.set_low();
        }
        Ok(())
    }
    fn pwm(&mut self, frequency_hz: f64, duty: f64) -> Result<(), HwError> {
        // Software PWM on any pin; hardware PWM channels would need the
        // pin-to-channel map of each Pi model.
        self.pin
            .set_pwm_frequency(frequency_hz, duty)
            .map_err(rppal_err(self.number))
    }
}

impl GpioBackend for RppalGpio {
    fn name(&self) -> &'static str {
        "rppal"
    }
    fn input(&self, pin: u8, pull: Pull) -> Result<Box<dyn GpioInput>, HwError> {
        let raw = self.gpio.get(pin).map_err(rppal_err(pin))?;
        let mut input = match pull {
            Pull::Up => raw.into_input_pullup(),
            Pull::Down => raw.into_input_pulldown(),
            Pull::None => raw.into_input(),
        };
        let (tx, rx) = watch::channel(input.is_high());
        // rppal calls back from its interrupt thread; the watch hands the
        // level to the async side without blocking that thread.
        input
            .set_async_interrupt(rppal::gpio::Trigger::Both, None, move |event| {
                tx.send_replace(event.trigger == rppal::gpio::Trigger::RisingEdge);
            })
            .map_err(rppal_err(pin))?;
        Ok(Box::new(RppalInput { pin: input, rx }))
    }
    fn output(&self, pin: u8) -> Result<Box<dyn GpioOutput>, HwError> {
        let output = self
            .gpio
            .get(pin)
            .map_err(rppal_err(pin))?
            .into_output_low();
        Ok(Box::new(RppalOutput {
            pin: output,
            number: pin,
        }))
    }
}

// ------------------------------------------------------------------ sensors and actuators

/// The logical value of an electrical level: 1.0 when it equals the active level.
pub fn logical(high: bool, active: Level) -> f64 {
    if high == (active == Level::High) {
        1.0
    } else {
        0.0
    }
}

/// Reads one input until shutdown: on every edge (or every `poll` period
/// where the backend has no edges), after `debounce`, records 0.0 or 1.0.
pub async fn run_input(
    name: String,
    mut input: Box<dyn GpioInput>,
    active: Level,
    debounce: Duration,
    poll: Option<Duration>,
    readings: Arc<dyn Readings>,
    shutdown: CancellationToken,
) {
    readings.source_health("gpio", Health::Ok);
    let mut last = input.read();
    readings.record(&name, logical(last, active));
    let mut changes = input.changes();
    let mut ticker = tokio::time::interval(poll.unwrap_or(Duration::from_millis(100)));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        let edge = match changes.as_mut() {
            Some(rx) => tokio::select! {
                changed = rx.changed() => changed.is_ok(),
                _ = ticker.tick(), if poll.is_some() => true,
                () = shutdown.cancelled() => return,
            },
            None => tokio::select! {
                _ = ticker.tick() => true,
                () = shutdown.cancelled() => return,
            },
        };
        if !edge {
            readings.source_health("gpio", Health::Disconnected);
            return;
        }
        if !debounce.is_zero() {
            // Contact bounce: only a level that persists counts.
            tokio::select! {
                () = tokio::time::sleep(debounce) => {}
                () = shutdown.cancelled() => return,
            }
        }
        let level = input.read();
        if level != last || poll.is_some() {
            last = level;
            readings.record(&name, logical(level, active));
        }
    }
}

/// A digital or PWM output as an actuator.
pub struct GpioActuator {
    output: Mutex<Box<dyn GpioOutput>>,
    active: Level,
    pwm_hz: Option<f64>,
}

impl fmt::Debug for GpioActuator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GpioActuator")
            .field("active", &self.active)
            .field("pwm_hz", &self.pwm_hz)
            .finish()
    }
}

impl GpioActuator {
    pub fn digital(output: Box<dyn GpioOutput>, active: Level) -> Self {
        GpioActuator {
            output: Mutex::new(output),
            active,
            pwm_hz: None,
        }
    }
    pub fn pwm(output: Box<dyn GpioOutput>, frequency_hz: f64) -> Self {
        GpioActuator {
            output: Mutex::new(output),
            active: Level::High,
            pwm_hz: Some(frequency_hz),
        }
    }
}

impl ActuatorDriver for GpioActuator {
    fn apply(&self, value: f64) -> DriverFuture<'_> {
        let mut output = self.output.lock();
        let result = match self.pwm_hz {
            Some(hz) => output.pwm(hz, value.clamp(0.0, 1.0)),
            None => output.set((value >= 0.5) == (self.active == Level::High)),
        };
        Box::pin(std::future::ready(result))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sim_outputs_and_active_low() {
        let chip = SimGpio::default();
        let out = GpioActuator::digital(chip.output(5).unwrap(), Level::Low);
        futures_util::FutureExt::now_or_never(out.apply(1.0))
            .unwrap()
            .unwrap();
        assert_eq!(
            chip.level(5),
            Some(false),
            "active-low: logical 1 drives the pin low"
        );
        let pwm = GpioActuator::pwm(chip.output(6).unwrap(), 500.0);
        futures_util::FutureExt::now_or_never(pwm.apply(0.25))
            .unwrap()
            .unwrap();
        assert_eq!(chip.pwm(6), Some((500.0, 0.25)));
        assert!(
            chip.input(5, Pull::None).is_err(),
            "an output is not an input"
        );
    }

    #[test]
    fn an_operator_drives_sim_inputs_but_never_an_output() {
        let gpio = SimGpio::default();
        let input = gpio.input(26, Pull::Up).unwrap();
        let _out = gpio.output(17).unwrap();
        assert!(input.read(), "pulled up");
        gpio.set_input(26, false).unwrap();
        assert!(!input.read());
        let refused = gpio.set_input(17, true).unwrap_err();
        assert!(
            refused.to_string().contains("an actuator drives it"),
            "{refused}"
        );
        assert_eq!(gpio.pins(), [(17, false, true), (26, false, false)]);
    }

    #[test]
    fn logical_levels() {
        assert_eq!(logical(true, Level::High), 1.0);
        assert_eq!(logical(true, Level::Low), 0.0);
        assert_eq!(logical(false, Level::Low), 1.0);
    }

    #[test]
    fn rppal_backend_is_refused_off_a_pi() {
        if !is_raspberry_pi() {
            assert!(matches!(
                open_backend(GpioBackendChoice::Rppal),
                Err(HwError::Unsupported(_))
            ));
            assert_eq!(
                open_backend(GpioBackendChoice::Auto)
                    .unwrap()
                    .backend
                    .name(),
                "sim"
            );
        }
    }
}
